"""`python -m weir_bench.experiments.crash_billing`: what streams are billed after kill -9 of `weir serve`.

A real `weir serve` (a child process on 127.0.0.1, keys on, SQLite) streams `--cut` long
completions at once. Once each has delivered a few tokens, the count each client has is noted
(the checkpoint), and the cut streams go on for `--hold-s` (until each received a token after
it); then `--finished` short streams run to `[DONE]`, and the server is killed with SIGKILL right
after the last one ends. Every stream asks for
`logprobs: 1`, so each chunk lists its tokens and the client counts exactly what it received.
The server is started again on the same data directory, replays its usage spool, and the
database's record of each stream is compared with what its client received:

- a finished stream must be `completed` with its exact token count;
- a cut stream is billed `delivered - shortfall`; `lag_s` is how long before the kill its first
  unbilled token reached the client (0 when nothing is unbilled). The promise
  (docs/operations.md) is `shortfall >= 0` and `lag_s <= USAGE_PROGRESS_INTERVAL_S` (plus the
  client's own read delay), so at least the checkpoint's count is billed.

Prints one JSON object (the streams and a summary); `run_crash` is what the end-to-end test
(tests/e2e/test_crash_billing.py) calls.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.weir_process import WeirProcess, resolve_model, run_weir

MODEL = "crash"
FLAGS = ("--served-model-name", MODEL, "--kv-cache-tokens", "65536")
_DONE = "data: [DONE]"


@dataclass
class StreamReading:
    """What one streaming client received: its request id and each token's arrival (monotonic)."""

    max_tokens: int
    request_id: str = ""
    checkpoint: int = 0  # tokens received when the checkpoint was taken
    arrivals: list[float] = field(default_factory=list)
    done: bool = False  # read `[DONE]`
    reported_tokens: int | None = None  # the final usage chunk's completion_tokens
    error: str = ""

    @property
    def delivered(self) -> int:
        return len(self.arrivals)


@dataclass(frozen=True)
class StreamBill:
    """One stream: what its client received, and what the database bills after the restart."""

    kind: str  # "finished" or "cut"
    request_id: str
    delivered: int
    checkpoint: int  # received at least `hold_s` before the kill
    reported_tokens: int | None
    status: str | None  # None: no record
    billed: int | None
    lag_s: float  # before the kill, when the first unbilled token arrived; 0 if none


def _read_stream(url: str, key: str, reading: StreamReading, prompt: str) -> None:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": reading.max_tokens,
        "stream": True,
        "ignore_eos": True,
        "logprobs": 1,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {key}"}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=120) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line == _DONE:
                    reading.done = True
                elif line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    reading.request_id = chunk["id"]
                    if chunk.get("usage"):
                        reading.reported_tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk["choices"]:
                        now = time.monotonic()
                        reading.arrivals += [now] * len((choice.get("logprobs") or {}).get("tokens", ()))
    except (httpx.TransportError, httpx.HTTPStatusError) as exc:  # the server died mid-stream
        reading.error = type(exc).__name__


def _stored(data: Path, request_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
    with sqlite3.connect(data / "weir.db") as conn:
        marks = ",".join("?" * len(request_ids))
        rows = conn.execute(
            f"SELECT request_id, status, completion_tokens FROM usage_records WHERE request_id IN ({marks})",
            tuple(request_ids),
        ).fetchall()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def _key(server: WeirProcess) -> str:
    admin = server.admin_headers()
    httpx.post(server.url + "/admin/v1/tenants", json={"name": "acme"}, headers=admin).raise_for_status()
    created = httpx.post(server.url + "/admin/v1/tenants/acme/keys", json={}, headers=admin)
    return str(created.raise_for_status().json()["key"])


def _wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_crash(
    model: Path,
    data: Path,
    *,
    num_cut: int = 16,
    num_finished: int = 4,
    warm_tokens: int = 8,
    hold_s: float = 2.0,
    finished_tokens: int = 12,
    flags: Sequence[str] = FLAGS,
) -> list[StreamBill]:
    """Stream, kill -9 right after the finished streams end, restart, and read the bills."""
    cut = [StreamReading(max_tokens=3000) for _ in range(num_cut)]
    finished = [StreamReading(max_tokens=finished_tokens) for _ in range(num_finished)]
    with run_weir(model, data, flags) as server:
        key = _key(server)
        threads = [
            threading.Thread(target=_read_stream, args=(server.url, key, r, f"cut stream {i}"), daemon=True)
            for i, r in enumerate(cut)
        ]
        for t in threads:
            t.start()
        if not _wait(lambda: all(r.delivered >= warm_tokens for r in cut), 300):
            raise RuntimeError(f"the cut streams did not start: {[r.delivered for r in cut]}")
        for r in cut:
            r.checkpoint = r.delivered
        # The cut streams go on past the checkpoint (a wait, not a measured time): each receives a
        # token `hold_s` after it, so its server side wrote records well after the checkpoint.
        after = time.monotonic() + hold_s
        if not _wait(lambda: all(r.arrivals[-1] > after for r in cut), hold_s + 300):
            raise RuntimeError("the cut streams stopped")
        done = [
            threading.Thread(
                target=_read_stream, args=(server.url, key, r, f"finished stream {i}"), daemon=True
            )
            for i, r in enumerate(finished)
        ]
        for t in done:
            t.start()
        for t in done:
            t.join(300)
        server.proc.send_signal(signal.SIGKILL)  # at once: no time for the usage writer's window
        killed_at = time.monotonic()
        server.proc.wait(timeout=30)
        for t in threads:
            t.join(60)
    readings = [("finished", r) for r in finished] + [("cut", r) for r in cut]
    ids = [r.request_id for _, r in readings]
    if not all(ids) or not all(r.done for r in finished):
        raise RuntimeError(
            f"a stream did not run: {[asdict(r) | {'arrivals': r.delivered} for _, r in readings]}"
        )
    with run_weir(model, data, flags):  # replays the spool left by the crash
        _wait(lambda: len(_stored(data, ids)) == len(ids), 60)
        stored = _stored(data, ids)
    bills = []
    for kind, r in readings:
        status, billed = stored.get(r.request_id, (None, None))
        unbilled = r.arrivals[billed:] if billed is not None else r.arrivals
        lag = killed_at - unbilled[0] if unbilled else 0.0
        bill = StreamBill(
            kind, r.request_id, r.delivered, r.checkpoint, r.reported_tokens, status, billed, lag
        )
        bills.append(bill)
    return bills


def summary(bills: Sequence[StreamBill]) -> dict[str, Any]:
    """Finished streams billed exactly as completed; the cut streams' shortfalls and lags."""
    finished = [b for b in bills if b.kind == "finished"]
    cut = [b for b in bills if b.kind == "cut"]
    shortfalls = [b.delivered - (b.billed or 0) for b in cut]
    lags = [b.lag_s for b in cut]
    return {
        "finished_exact": sum(
            b.status == "completed" and b.billed == b.delivered == b.reported_tokens for b in finished
        ),
        "finished": len(finished),
        "cut": len(cut),
        "cut_over_billed": sum(s < 0 for s in shortfalls),
        "cut_under_checkpoint": sum((b.billed or 0) < b.checkpoint for b in cut),
        "cut_shortfall_tokens": {
            "max": max(shortfalls, default=0),
            "median": statistics.median(shortfalls or [0]),
        },
        "cut_lag_s": {
            "max": round(max(lags, default=0.0), 3),
            "median": round(statistics.median(lags or [0.0]), 3),
        },
        "cut_delivered_median": statistics.median([b.delivered for b in cut] or [0]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: a random 2-layer Llama")
    parser.add_argument("--cut", type=int, default=16, help="streams cut by the kill")
    parser.add_argument("--finished", type=int, default=4, help="streams that end just before it")
    parser.add_argument("--hold-s", type=float, default=2.0, help="the cut streams' time past the checkpoint")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weir-crash-") as tmp:
        model = resolve_model(args.model, Path(tmp))
        bills = run_crash(
            model, Path(tmp) / "data", num_cut=args.cut, num_finished=args.finished,
            hold_s=args.hold_s, flags=(*FLAGS, "--device", args.device),
        )  # fmt: skip
    print(json.dumps({"summary": summary(bills), "streams": [asdict(b) for b in bills]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
