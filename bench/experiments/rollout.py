"""The rollout benchmark (issue 12): a model-version rollout under steady traffic.

Starts `weir serve` on 127.0.0.1 (SmolLM2-135M-Instruct by default, keys on, admission on) as
version v1, replays `../shared/workloads/mixed.jsonl` (its chats, its tenants, max_tokens capped
by `--max-tokens`) open-loop at `--rate` requests per second, and in the middle runs the rollout:
register v2 (a second copy of the same weights by default, or `--model-v2`), load it, split
10% -> 50% -> 100%, drain v1, retire v1; then traffic goes on for `--tail-s` and stops.

Measured, per request (streamed, through httpx): status, whether it ended with [DONE], TTFT and
the `x-weir-model-version` header. Reported: errors (the target is 0), TTFT p99 of the requests
started during the switch (from the load call to the end of the retire) over that of the steady
state before it (the target is <= 1.5x), the time from the load call to the first token served by
v2 (and the load call alone), and the memory of the server process (RSS) around the load and the
retire, with the retire answer's own figures.

Run: python -m weir_bench.experiments.rollout --out bench-out/rollout [--rate 0.25] [--steady-s 80]
Writes summary.json and summary.md in --out. Bounded: at most --max-requests requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from weir_bench.hostile import timed_stream
from weir_bench.stats import LatencySummary
from weir_bench.tenants import TenantSpec, create_tenants
from weir_bench.weir_process import ROOT, WeirProcess, rss_bytes, run_weir
from weir_bench.workloads import RequestKind, WorkloadRequest, load_trace

MODEL = "smollm2"
_SETTLE_S = 5.0  # the steady state after the switch starts this long after the retire answered
DEFAULT_TRACE = ROOT.parent / "shared" / "workloads" / "mixed.jsonl"  # ../shared from the repository root


@dataclass(frozen=True)
class Record:
    started_s: float  # monotonic
    status: int
    complete: bool
    ttft_s: float | None
    version: str | None


async def _stream(client: httpx.AsyncClient, url: str, key: str, body: dict[str, Any]) -> Record:
    r = await timed_stream(client, url, key, body)
    return Record(r.started_s, r.status, r.complete, r.ttft_s, r.model_version)


def _body(req: WorkloadRequest, max_tokens: int) -> dict[str, Any]:
    assert req.kind is RequestKind.CHAT
    return {
        "model": MODEL,
        "messages": [{"role": m.role, "content": m.content} for m in req.messages],
        "max_tokens": min(req.max_tokens, max_tokens),
        "stream": True,
    }


async def _traffic(
    args: argparse.Namespace,
    server: WeirProcess,
    keys: dict[str, str],
    trace: list[WorkloadRequest],
    stop: asyncio.Event,
) -> list[Record]:
    """Open loop: request i at start + i / rate, cycling through the trace, until `stop`."""
    tasks: list[asyncio.Task[Record]] = []
    async with httpx.AsyncClient(timeout=args.timeout_s) as client:
        start = time.monotonic()
        for i in range(args.max_requests):
            await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            if stop.is_set():
                break
            req = trace[i % len(trace)]
            tasks.append(
                asyncio.create_task(
                    _stream(client, server.url, keys[req.tenant], _body(req, args.max_tokens))
                )
            )
        return list(await asyncio.gather(*tasks))


async def _rollout(
    args: argparse.Namespace, server: WeirProcess, model_v2: Path, stop: asyncio.Event
) -> dict[str, Any]:
    """The admin calls, timed; returns the marks and memory figures."""
    marks: dict[str, Any] = {}
    base = f"{server.url}/admin/v1/models"
    async with httpx.AsyncClient(timeout=900, headers=server.admin_headers()) as admin:

        async def call(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
            answer = await admin.request(method, base + path, json=body)
            if answer.status_code not in (200, 201):
                raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:500]}")
            return answer

        await asyncio.sleep(args.steady_s)
        marks["rss_before_load"] = rss_bytes(server.pid)
        marks["load_start"] = time.monotonic()
        spec = {
            "name": MODEL,
            "version": "v2",
            "path": str(model_v2),
            "kv_cache_tokens": args.kv_cache_tokens,
        }
        await call("POST", "", spec)
        await call("POST", f"/{MODEL}/versions/v2/load")
        marks["load_done"] = time.monotonic()
        marks["rss_after_load"] = rss_bytes(server.pid)
        for split in ({"v1": 90, "v2": 10}, {"v1": 50, "v2": 50}, {"v2": 100}):
            await call("PUT", f"/{MODEL}/traffic", {"split": split, "pins": {}})
            marks[f"split_{split.get('v2')}"] = time.monotonic()
            await asyncio.sleep(args.step_s)
        await call("POST", f"/{MODEL}/versions/v1/drain")
        marks["rss_before_retire"] = rss_bytes(server.pid)
        marks["retire_start"] = time.monotonic()
        retired = await call("POST", f"/{MODEL}/versions/v1/retire")
        marks["switch_end"] = time.monotonic()
        marks["rss_after_retire"] = rss_bytes(server.pid)
        marks["retire_released_bytes"] = int(retired.headers.get("x-weir-memory-released-bytes", 0))
        freed = retired.headers.get("x-weir-memory-freed-bytes")
        marks["retire_freed_bytes"] = None if freed is None else int(freed)
        await asyncio.sleep(args.tail_s)
    stop.set()
    return marks


def summarize(
    records: list[Record], marks: dict[str, Any], t0: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Errors, TTFT per phase and their ratio, load-to-first-v2-token, memory."""
    ok = [r for r in records if r.status == 200 and r.complete]
    steady = [
        r.ttft_s
        for r in ok
        if t0 + args.warmup_s <= r.started_s < marks["load_start"] and r.ttft_s is not None
    ]
    switch = [
        r.ttft_s
        for r in ok
        if marks["load_start"] <= r.started_s <= marks["switch_end"] and r.ttft_s is not None
    ]
    # After the switch (v2 alone), the same steady traffic again: on a shared machine the load of
    # other processes drifts, so the switch is compared with the steady state on both sides.
    after = [r.ttft_s for r in ok if r.started_s > marks["switch_end"] + _SETTLE_S and r.ttft_s is not None]
    steady_s = LatencySummary.of(t * 1000 for t in steady)
    switch_s = LatencySummary.of(t * 1000 for t in switch)
    after_s = LatencySummary.of(t * 1000 for t in after)
    firsts = [r.started_s + r.ttft_s for r in ok if r.version == "v2" and r.ttft_s is not None]
    mib = 2**20
    return {
        "requests": len(records),
        "errors": sum(1 for r in records if not (r.status == 200 and r.complete)),
        "by_version": {v: sum(r.version == v for r in records) for v in ("v1", "v2")},
        "ttft_steady_ms": steady_s.to_json(1) | {"count": steady_s.count},
        "ttft_switch_ms": switch_s.to_json(1) | {"count": switch_s.count},
        "ttft_after_ms": after_s.to_json(1) | {"count": after_s.count},
        "ttft_p99_ratio": (switch_s.p99 / steady_s.p99) if steady_s.p99 and switch_s.p99 else None,
        "ttft_p99_ratio_vs_after": (switch_s.p99 / after_s.p99) if after_s.p99 and switch_s.p99 else None,
        "load_call_s": marks["load_done"] - marks["load_start"],
        "load_to_first_v2_token_s": (min(firsts) - marks["load_start"]) if firsts else None,
        "split10_to_first_v2_token_s": (min(firsts) - marks["split_10"]) if firsts else None,
        "retire_call_s": marks["switch_end"] - marks["retire_start"],
        "rss_mib": {
            k: round(marks[k] / mib, 1)
            for k in ("rss_before_load", "rss_after_load", "rss_before_retire", "rss_after_retire")
        },
        "rss_freed_by_retire_mib": round((marks["rss_before_retire"] - marks["rss_after_retire"]) / mib, 1),
        "retire_released_budget_mib": round(marks["retire_released_bytes"] / mib, 1),
        "retire_measured_freed_mib": None
        if marks["retire_freed_bytes"] is None
        else round(marks["retire_freed_bytes"] / mib, 1),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }


def _markdown(s: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| figure | value |",
            "|---|---|",
            f"| requests / errors | {s['requests']} / {s['errors']} |",
            f"| served by v1 / v2 | {s['by_version']['v1']} / {s['by_version']['v2']} |",
            f"| TTFT p99 steady before / switch / steady after (ms) | {s['ttft_steady_ms']['p99']} / "
            f"{s['ttft_switch_ms']['p99']} / {s['ttft_after_ms']['p99']} |",
            f"| TTFT p50 steady before / switch / steady after (ms) | {s['ttft_steady_ms']['p50']} / "
            f"{s['ttft_switch_ms']['p50']} / {s['ttft_after_ms']['p50']} |",
            f"| TTFT p99 ratio switch / steady after | {s['ttft_p99_ratio_vs_after']:.2f} |"
            if s["ttft_p99_ratio_vs_after"]
            else "| ratio vs after | n/a |",
            f"| TTFT p99 ratio switch / steady | {s['ttft_p99_ratio']:.2f} |"
            if s["ttft_p99_ratio"]
            else "| ratio | n/a |",
            f"| load call (s) | {s['load_call_s']:.1f} |",
            f"| load call to first v2 token (s) | {s['load_to_first_v2_token_s']} |",
            f"| RSS before load / after load / before retire / after retire (MiB) | {' / '.join(str(v) for v in s['rss_mib'].values())} |",
            f"| RSS freed by retire (MiB) | {s['rss_freed_by_retire_mib']} |",
            f"| retire answer: budget released / measured freed (MiB) | {s['retire_released_budget_mib']} / {s['retire_measured_freed_mib']} |",
        ]
    )


async def _run(args: argparse.Namespace, server: WeirProcess, model_v2: Path) -> dict[str, Any]:
    trace = load_trace(args.trace)
    async with httpx.AsyncClient(timeout=60) as client:
        keys = await create_tenants(
            client, server.url, server.admin_token, [TenantSpec(t) for t in sorted({r.tenant for r in trace})]
        )
    stop = asyncio.Event()
    t0 = time.monotonic()
    records, marks = await asyncio.gather(
        _traffic(args, server, keys, trace, stop), _rollout(args, server, model_v2, stop)
    )
    with (args.out / "records.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps({**asdict(r), "started_s": r.started_s - t0}) + "\n")
    (args.out / "marks.json").write_text(
        json.dumps(
            {
                k: v - t0 if k.endswith(("_start", "_done", "_end")) or k.startswith("split_") else v
                for k, v in marks.items()
            }
        )
    )
    return summarize(records, marks, t0, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None, help="v1 weights (default: SmolLM2, prepared)")
    parser.add_argument("--model-v2", type=Path, default=None, help="v2 weights (default: the same folder)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--rate", type=float, default=0.25, help="requests per second (open loop)")
    parser.add_argument("--max-tokens", type=int, default=16, help="cap on each request's max_tokens")
    parser.add_argument("--max-requests", type=int, default=600)
    parser.add_argument("--kv-cache-tokens", type=int, default=16384)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--steady-s", type=float, default=80.0)
    parser.add_argument("--step-s", type=float, default=25.0)
    parser.add_argument("--tail-s", type=float, default=50.0)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.model is None:
        from weir.engine.runner.model_prepare import ensure_default_model
        from weir.gateway.settings.settings import Settings

        args.model = ensure_default_model(Settings.from_environment().cache_dir, progress=False)
    model_v2 = args.model_v2 or args.model
    args.out.mkdir(parents=True, exist_ok=True)
    flags = [
        "--served-model-name",
        MODEL,
        "--model-version",
        "v1",
        "--kv-cache-tokens",
        str(args.kv_cache_tokens),
    ]
    flags += ["--max-model-len", "2048"]
    with run_weir(args.model, args.out / "data", flags, start_timeout_s=300) as server:
        summary = asyncio.run(_run(args, server, model_v2))
    summary["settings"] = {k: str(v) for k, v in summary["settings"].items()}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "summary.md").write_text(_markdown(summary) + "\n")
    print(_markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
