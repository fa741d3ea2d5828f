"""`python -m weir_bench.experiments.db_outage --out DIR`: usage records across a database outage under load.

The gateway as `weir serve` wires it (keys on, SQLite, admission, the usage writer and its spool)
runs over the null engine in a child process (`weir_bench.overhead_server`) on 127.0.0.1. A bounded
closed loop of chat requests runs for `--before-s`, then the SQLite file is locked (`BEGIN
EXCLUSIVE` from this process, as the issue reproduced it) for `--outage-s`, then released for
`--after-s`. After the load, the server gets SIGTERM (a graceful stop). The figures: requests
served (200) per phase, usage records in the database, and records lost: request ids answered
200 with no usage record (must be 0), or stored more than once (must be 0).

Writes `DIR/db_outage.json` and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.gateway_overhead import AuthSetup, OverheadConfig, benchmark_server
from weir_bench.metadata import git_commit, machine_info, now_utc, redacted_command
from weir_bench.overhead_server import MODEL_NAME

PHASES = ("before", "outage", "after")


@dataclass(frozen=True)
class OutageConfig:
    """One run; validated on construction."""

    model: Path  # a folder with the tokenizer the server uses
    out_dir: Path
    outage_s: float = 30.0
    before_s: float = 5.0
    after_s: float = 5.0
    concurrency: int = 4  # requests in flight
    max_requests: int = 100_000  # a bound on the loop, whatever the speed
    catch_up_timeout_s: float = 120.0  # after the outage: wait at most this for the records
    command: str = ""

    def __post_init__(self) -> None:
        for name in ("outage_s", "before_s", "after_s", "catch_up_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")


@dataclass
class PhaseCounts:
    """Requests sent in one phase, by outcome."""

    num_sent: int = 0
    num_ok: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "200", "503", "timeout", ...


@dataclass
class LoadState:
    """What the load loop saw; the phase is set by the outage driver."""

    phase: str = "before"
    ok_ids: list[str] = field(default_factory=list)
    phases: dict[str, PhaseCounts] = field(default_factory=lambda: {p: PhaseCounts() for p in PHASES})
    num_sent: int = 0


async def _client_loop(
    client: httpx.AsyncClient, state: LoadState, stop_at: float, max_requests: int
) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    while time.monotonic() < stop_at and state.num_sent < max_requests:
        state.num_sent += 1
        counts = state.phases[state.phase]
        counts.num_sent += 1
        try:
            r = await client.post("/v1/chat/completions", json=body)
            outcome = str(r.status_code)
            if r.status_code == 200:
                counts.num_ok += 1
                state.ok_ids.append(r.json()["id"])
        except httpx.TimeoutException:
            outcome = "timeout"
        except httpx.TransportError as exc:
            outcome = type(exc).__name__
        counts.statuses[outcome] = counts.statuses.get(outcome, 0) + 1


async def _drive(root: str, header: dict[str, str], database: Path, config: OutageConfig) -> LoadState:
    state = LoadState()
    start = time.monotonic()
    stop_at = start + config.before_s + config.outage_s + config.after_s
    async with httpx.AsyncClient(base_url=root, headers=header, trust_env=False, timeout=30.0) as client:
        (await client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": [
            {"role": "user", "content": "warm up"}], "max_tokens": 1})).raise_for_status()  # fmt: skip
        loops = [
            asyncio.create_task(_client_loop(client, state, stop_at, config.max_requests))
            for _ in range(config.concurrency)
        ]
        await asyncio.sleep(config.before_s)
        lock = await asyncio.to_thread(_lock, database)
        state.phase = "outage"
        try:
            await asyncio.sleep(config.outage_s)
        finally:
            await asyncio.to_thread(_unlock, lock)
        state.phase = "after"
        await asyncio.gather(*loops)
    return state


def _lock(database: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(database, isolation_level=None, timeout=30.0, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def _unlock(conn: sqlite3.Connection) -> None:
    conn.execute("ROLLBACK")
    conn.close()


def _stored(database: Path) -> dict[str, int]:
    with sqlite3.connect(database, timeout=30.0) as conn:
        return dict(conn.execute("SELECT request_id, count(*) FROM usage_records GROUP BY request_id"))


def _wait_for_records(database: Path, ok_ids: Sequence[str], timeout_s: float) -> float | None:
    """Seconds until every served request has its record; None if not within `timeout_s`."""
    start = time.monotonic()
    wanted = set(ok_ids)
    while True:
        if wanted <= _stored(database).keys():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(0.5)


def run_outage(config: OutageConfig) -> dict[str, Any]:
    """One run: serve, load, lock, unlock, stop; the report (also written to out_dir)."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    server_config = OverheadConfig(model=config.model, out_dir=config.out_dir, output_tokens=4)
    with tempfile.TemporaryDirectory(prefix="weir-db-outage-") as tmp:
        data_dir = Path(tmp)
        database = data_dir / "weir.db"
        with benchmark_server(server_config, AuthSetup.KEYS, data_dir) as server:
            state = asyncio.run(_drive(server.root, server.auth_header, database, config))
            catch_up_s = _wait_for_records(database, state.ok_ids, config.catch_up_timeout_s)
        stored = _stored(database)  # after the graceful stop
        spool_left = sorted(p.name for p in (data_dir / "usage-spool").glob("seg-*.jsonl"))
    ok_ids = collections.Counter(state.ok_ids)
    lost = [request_id for request_id in ok_ids if request_id not in stored]
    report = {
        "date": now_utc(),
        "command": config.command,
        "commit": git_commit(),
        "machine": machine_info(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "phases": {name: asdict(counts) for name, counts in state.phases.items()},
        "num_served": len(state.ok_ids) + 1,  # and the warm-up request
        "num_records_in_db": sum(stored.values()),
        "num_records_lost": len(lost),
        "num_request_ids_stored_twice": sum(1 for n in stored.values() if n > 1),
        "num_duplicate_ids_served": sum(1 for n in ok_ids.values() if n > 1),
        "catch_up_s": None if catch_up_s is None else round(catch_up_s, 2),
        "spool_segments_left": spool_left,
        "lost_sample": lost[:20],
    }
    (config.out_dir / "db_outage.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _default_model() -> Path:
    from weir.engine.runner.model_prepare import ensure_default_model
    from weir.gateway.settings.settings import Settings

    return ensure_default_model(Settings.from_environment({}).cache_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the figures; 1 if any record was lost, 2 on bad flags or a failed start."""
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.db_outage", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("bench-out/db-outage"), help="output directory")
    p.add_argument(
        "--model", type=Path, help="model folder whose tokenizer is served (default: the default model)"
    )
    p.add_argument(
        "--outage-s", type=float, default=30.0, help="how long the database is locked (default 30)"
    )
    p.add_argument("--before-s", type=float, default=5.0, help="load before the outage (default 5)")
    p.add_argument("--after-s", type=float, default=5.0, help="load after the outage (default 5)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument(
        "--max-requests", type=int, default=100_000, help="bound on requests sent (default 100000)"
    )
    args = p.parse_args(argv)
    try:
        config = OutageConfig(
            model=args.model if args.model is not None else _default_model(),
            out_dir=args.out,
            outage_s=args.outage_s,
            before_s=args.before_s,
            after_s=args.after_s,
            concurrency=args.concurrency,
            max_requests=args.max_requests,
            command=redacted_command(
                [
                    "python",
                    "-m",
                    "weir_bench.experiments.db_outage",
                    *(argv if argv is not None else sys.argv[1:]),
                ]
            ),
        )
        report = run_outage(config)
    except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
        print(f"bench db_outage: {exc}", file=sys.stderr)
        return 2
    for name, counts in report["phases"].items():
        print(
            f"{name:>7}: sent {counts['num_sent']}, served {counts['num_ok']}, statuses {counts['statuses']}"
        )
    print(
        f"served {report['num_served']} requests; {report['num_records_in_db']} usage records in the database; "
        f"lost {report['num_records_lost']}; stored twice {report['num_request_ids_stored_twice']}; "
        f"caught up {report['catch_up_s']} s after the load; spool segments left {len(report['spool_segments_left'])}"
    )
    return 1 if report["num_records_lost"] or report["num_request_ids_stored_twice"] else 0


if __name__ == "__main__":
    sys.exit(main())
