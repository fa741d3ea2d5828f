"""The soak (`make soak`, not in CI): mixed traffic against a real `weir serve` for minutes.

Starts `weir serve` on 127.0.0.1 (a random 2-layer Llama by default, `--model` for SmolLM2 or any
folder; keys on, admission on), creates `--tenants` tenants, and runs `--workers` clients for
`--duration-s` (bounded also by `--max-requests`): well-behaved streams and non-streamed calls,
streams cancelled after their first bytes, and bad inputs from `weir_bench.hostile`. Every 5 s it
samples the server's RSS. Per minute it reports the count of each outcome, TTFT and end-to-end
percentiles of the well-behaved streams, and the RSS; at the end, the RSS growth (from the end of
the first minute, so warm-up allocations do not count) and whether the server went back to idle
(every KV block free, nothing running or waiting).

Run: python -m weir_bench.experiments.soak --out bench-out/soak [--duration-s 600] [--model PATH]
Writes summary.json and summary.md in --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.hostile import HOSTILE, Probe, StreamResult, Target, send, timed_stream
from weir_bench.stats import LatencySummary
from weir_bench.weir_process import WeirProcess, resolve_model, rss_bytes, run_weir, scrape_gauges

_BAD = tuple(p for p in HOSTILE if p.defect in {"1", "3", "5", "7"})
_CANCEL = next(p for p in HOSTILE if p.stream_then_cancel)
_MIB = 1024 * 1024


@dataclass
class Minute:
    """What happened in one minute of the soak (requests counted by their start)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)


def _outcome(status: int) -> str:
    if status == 0:
        return "cancelled"
    if status < 0:
        return "transport_error"
    return f"{status // 100}xx"


class Soak:
    """The traffic of one soak run and its per-minute record."""

    def __init__(
        self, args: argparse.Namespace, server: WeirProcess, keys: dict[str, str], model: str
    ) -> None:
        self.args = args
        self.server = server
        self.keys = list(keys.values())
        self.model = model
        self.minutes: dict[int, Minute] = defaultdict(Minute)
        self.num_sent = 0
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.duration_s

    def _minute(self, started_s: float) -> Minute:
        return self.minutes[int((started_s - self.t0) // 60)]

    async def _sample_rss(self) -> None:
        while time.monotonic() < self.deadline:
            self._minute(time.monotonic()).rss.append(rss_bytes(self.server.pid))
            await asyncio.sleep(5)

    async def _worker(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        while time.monotonic() < self.deadline and self.num_sent < self.args.max_requests:
            self.num_sent += 1
            key = rng.choice(self.keys)
            roll = rng.random()
            started = time.monotonic()
            minute = self._minute(started)
            if roll < 0.65:
                result = await self._good(client, key, rng)
                minute.outcomes["stream_ok" if result.complete else f"stream_{_outcome(result.status)}"] += 1
                if result.complete and result.ttft_s is not None:
                    minute.ttft_s.append(result.ttft_s)
                    minute.e2e_s.append(result.e2e_s)
                continue
            probe: Probe = _CANCEL if roll < 0.85 else rng.choice(_BAD)
            target = Target(self.server.url, self.model, key, self.args.kv_cache_tokens)
            status = await send(client, probe, target)
            minute.outcomes[f"{probe.name}_{_outcome(status)}"] += 1

    async def _good(self, client: httpx.AsyncClient, key: str, rng: random.Random) -> StreamResult:
        words = " ".join(
            rng.choice(("soak", "test", "tenant", "kv", "block")) for _ in range(rng.randint(5, 120))
        )
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": rng.randint(8, 48),
            "stream": True,
            "ignore_eos": True,
        }
        return await timed_stream(client, self.server.url, key, body)

    async def run(self) -> None:
        rng = random.Random(self.args.seed)
        limits = httpx.Limits(max_connections=self.args.workers * 2)
        async with httpx.AsyncClient(timeout=self.args.timeout_s, limits=limits) as client:
            sampler = asyncio.create_task(self._sample_rss())
            await asyncio.gather(
                *(self._worker(client, random.Random(rng.random())) for _ in range(self.args.workers))
            )
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler


def _ms(summary: LatencySummary) -> dict[str, float | None]:
    return {k: None if v is None else round(v * 1000, 1) for k, v in summary.to_json(6).items()}


def summarize(soak: Soak, idle: dict[str, float], rss_after: int) -> dict[str, Any]:
    """The JSON report."""
    minutes = []
    for index in sorted(soak.minutes):
        m = soak.minutes[index]
        minutes.append(
            {
                "minute": index + 1,
                "outcomes": dict(sorted(m.outcomes.items())),
                "ttft_ms": _ms(LatencySummary.of(m.ttft_s)),
                "e2e_ms": _ms(LatencySummary.of(m.e2e_s)),
                "rss_mib": round(max(m.rss) / _MIB, 1) if m.rss else None,
            }
        )
    samples = [r for i in sorted(soak.minutes) for r in soak.minutes[i].rss if r]
    first_minute = soak.minutes[min(soak.minutes)].rss if soak.minutes else []
    warm = first_minute[-1] if first_minute else (samples[0] if samples else 0)
    totals: Counter[str] = Counter()
    for m in soak.minutes.values():
        totals.update(m.outcomes)
    return {
        "duration_s": soak.args.duration_s,
        "workers": soak.args.workers,
        "tenants": soak.args.tenants,
        "requests": soak.num_sent,
        "outcomes": dict(sorted(totals.items())),
        "num_5xx": sum(v for k, v in totals.items() if k.endswith("5xx")),
        "rss_mib": {
            "first_sample": round(samples[0] / _MIB, 1) if samples else None,
            "after_first_minute": round(warm / _MIB, 1),
            "max": round(max(samples) / _MIB, 1) if samples else None,
            "after": round(rss_after / _MIB, 1),
            "growth_after_first_minute": round((rss_after - warm) / _MIB, 1),
        },
        "idle_after": idle,
        "minutes": minutes,
    }


def markdown(report: dict[str, Any]) -> str:
    """The Markdown summary."""
    rss = report["rss_mib"]
    lines = [
        f"# Soak: {report['duration_s']:.0f} s, {report['workers']} clients, {report['tenants']} tenants",
        "",
        f"- requests: {report['requests']}; 5xx: {report['num_5xx']}",
        f"- RSS (MiB): first {rss['first_sample']}, after minute 1 {rss['after_first_minute']}, "
        f"max {rss['max']}, after {rss['after']}; growth after minute 1: {rss['growth_after_first_minute']}",
        f"- idle after: {json.dumps(report['idle_after'])}",
        "",
        "| minute | stream ok | cancelled | 4xx | 5xx | TTFT p50 / p99 ms | e2e p50 / p99 ms | RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in report["minutes"]:
        o = m["outcomes"]
        count = sum(v for k, v in o.items() if k.endswith("4xx"))
        fives = sum(v for k, v in o.items() if k.endswith("5xx"))
        cancelled = sum(v for k, v in o.items() if k.endswith("cancelled"))
        lines.append(
            f"| {m['minute']} | {o.get('stream_ok', 0)} | {cancelled} | {count} | {fives} | "
            f"{m['ttft_ms']['p50']} / {m['ttft_ms']['p99']} | {m['e2e_ms']['p50']} / {m['e2e_ms']['p99']} | "
            f"{m['rss_mib']} |"
        )
    return "\n".join(lines) + "\n"


async def _create_keys(server: WeirProcess, num_tenants: int) -> dict[str, str]:
    from weir_bench.tenants import TenantSpec, create_tenants

    specs = [TenantSpec(f"soak-{i}", quota={"tokens_per_minute": 10_000_000}) for i in range(num_tenants)]
    async with httpx.AsyncClient(timeout=30) as client:
        return await create_tenants(client, server.url, server.admin_token, specs)


def _wait_idle(server: WeirProcess, timeout_s: float = 60) -> dict[str, float]:
    names = ("weir_num_requests_running", "weir_num_requests_waiting", "weir_kv_cache_free_blocks")
    names += ("weir_kv_cache_total_blocks",)
    deadline = time.monotonic() + timeout_s
    while True:
        gauges = scrape_gauges(server.metrics_url, names)
        idle = (
            gauges["weir_num_requests_running"] == 0
            and gauges["weir_num_requests_waiting"] == 0
            and gauges["weir_kv_cache_free_blocks"] == gauges["weir_kv_cache_total_blocks"]
        )
        if idle or time.monotonic() > deadline:
            return {**gauges, "idle": float(idle)}
        time.sleep(0.5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.soak", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=Path("bench-out/soak"))
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument(
        "--max-requests", type=int, default=200_000, help="stop after this many, whatever the time"
    )
    p.add_argument("--model", type=Path, default=None, help="default: a random 2-layer Llama")
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args.model, args.out)
    flags = ["--kv-cache-tokens", str(args.kv_cache_tokens), "--max-model-len", str(args.max_model_len)]
    flags += ["--device", "cpu"] if args.model is None else []
    with run_weir(model, args.out / "data", flags, log_path=args.out / "server.log") as server:
        keys = asyncio.run(_create_keys(server, args.tenants))
        soak = Soak(args, server, keys, model.name)
        print(f"soak: {args.duration_s:.0f} s against {server.url} (pid {server.pid})", flush=True)
        asyncio.run(soak.run())
        idle = _wait_idle(server)
        report = summarize(soak, idle, rss_bytes(server.pid))
    (args.out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "summary.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    return 0 if report["num_5xx"] == 0 and idle["idle"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
