"""The attacker benchmark (issue 10): can one tenant hurt another's steady traffic?

Starts `weir serve` on 127.0.0.1 (a random 2-layer Llama by default; keys on, admission on) with
two tenants. The victim sends the same steady, bounded traffic (streamed chats at a fixed rate)
in two phases: `alone`, then `attacked`, while the attacker loops every input of `weir_bench.hostile`
(huge seeds, a prompt that can never fit the KV pool, bogus keys from the same address,
beam_width 16, no max_tokens, lone surrogates, deep JSON, /metrics without the token, cancels)
from `--attackers` concurrent clients. `--rounds` repeats the pair (alone, attacked) and pools
each phase's requests.

The issue's target: the victim's success rate stays 100% and its TTFT p99 under attack stays
within 1.2x of its p99 alone. The attacker's answers are counted per input, 5xx separately.

`--flood NAME` (issue 21) replaces the hostile inputs by one flood from `--attackers` concurrent
connections (200 in the issue): `random_key_ids` (a well-formed key with a new random id each
request) or `unknown_paths_victim_id` (unknown paths presenting the victim's public key id). Its
target: the victim's TTFT p50 within 1.5x of its p50 alone.

Issue 54's floods (bench/costly_floods.py) are valid requests at the most a field allows:
`--flood regex` (`structured_outputs.regex` with nested repetitions: one past any cost bound, one
admitted but ambiguous; a fresh literal in front of each so every request compiles), `logit-bias` (300
biased tokens), `stop` (16 stop strings of 512 characters), `logprobs` (`top_logprobs` 20), and
`plain`, the control: the same chats without a costly field (the price of the attacker's streams
alone, which a costly flood should not exceed by much). Every
flood's report gives the victim's TTFT p99 and its largest gap between two chunks, attacked /
alone, beside the p50.

Run: python -m weir_bench.experiments.attacker --out bench-out/attacker [--model PATH] [--requests 120] [--rate 4]
     python -m weir_bench.experiments.attacker --flood random_key_ids --attackers 200 --out bench-out/flood
     python -m weir_bench.experiments.attacker --flood regex --model PATH --out bench-out/flood-regex
Writes summary.json and summary.md in --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from weir.tenancy.keys.keys import parse_key
from weir_bench.costly_floods import COSTLY_FLOODS, COSTLY_PROBES
from weir_bench.hostile import FLOODS, HOSTILE, StreamResult, Target, send, timed_stream
from weir_bench.stats import LatencySummary
from weir_bench.tenants import TenantSpec, create_tenants
from weir_bench.weir_process import WeirProcess, resolve_model, run_weir, scrape_gauges

VICTIM, ATTACKER = "victim", "attacker"
# --flood name -> the probes it loops: issue 21's one each, issue 54's (bench/costly_floods.py)
FLOOD_PROBES: dict[str, tuple[str, ...]] = {**{f.name: (f.name,) for f in FLOODS}, **COSTLY_FLOODS}


def attack_probe_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The probes the attacker loops: the flood's, or else `--probes`."""
    return FLOOD_PROBES[args.flood] if args.flood else tuple(args.probes)


async def _victim(args: argparse.Namespace, server: WeirProcess, key: str, model: str) -> list[StreamResult]:
    """`args.requests` streamed chats, one every 1/rate seconds (open loop), all awaited."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Steady traffic from a well-behaved tenant, please."}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=args.timeout_s) as client:
        tasks = []
        start = time.monotonic()
        for i in range(args.requests):
            await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            tasks.append(asyncio.create_task(timed_stream(client, server.url, key, body)))
        return list(await asyncio.gather(*tasks))


async def _attack_loop(
    target: Target, stop: Any, num_clients: int, names: tuple[str, ...], started: Any = None
) -> dict[str, Counter[int]]:
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    probes = [p for p in (*HOSTILE, *FLOODS, *COSTLY_PROBES) if p.name in names]

    async def one(offset: int) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            i = offset
            while not stop.is_set():
                probe = probes[i % len(probes)]
                counts[probe.name][await send(client, probe, target)] += 1
                if started is not None and not started.is_set():
                    started.set()
                i += 1

    await asyncio.gather(*(one(i * 3) for i in range(num_clients)))
    return counts


def _attacker_process(
    target: Target, stop: Any, num_clients: int, names: tuple[str, ...], out: Any, started: Any = None
) -> None:
    """The attacker's own process: its client work never delays the victim's event loop."""
    counts = asyncio.run(_attack_loop(target, stop, num_clients, names, started))
    out.put({name: dict(c) for name, c in counts.items()})


async def _phase(
    args: argparse.Namespace, server: WeirProcess, keys: dict[str, str], model: str, attacked: bool
) -> tuple[list[StreamResult], dict[str, Counter[int]]]:
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    if not attacked:
        return await _victim(args, server, keys[VICTIM], model), counts
    ctx = multiprocessing.get_context("spawn")
    stop, out, started = ctx.Event(), ctx.Queue(), ctx.Event()
    victim = parse_key(keys[VICTIM])
    target = Target(server.url, model, keys[ATTACKER], args.kv_cache_tokens, victim.key_id if victim else "")
    names = attack_probe_names(args)
    proc = ctx.Process(
        target=_attacker_process, args=(target, stop, args.attackers, names, out, started), daemon=True
    )
    proc.start()
    try:
        # The attack is under way before the victim starts: a spawned process takes seconds to
        # import, so wait for its first answer, then let it build up.
        await asyncio.to_thread(started.wait, 120)
        await asyncio.sleep(3.0)
        results = await _victim(args, server, keys[VICTIM], model)
    finally:
        stop.set()
        found = await asyncio.to_thread(out.get, True, 180)
        proc.join(timeout=30)
    for name, c in found.items():
        counts[name].update(c)
    return results, counts


def _phase_report(results: list[StreamResult]) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200 and r.complete and r.ttft_s is not None]
    ttft = LatencySummary.of(r.ttft_s for r in ok if r.ttft_s is not None)
    e2e = LatencySummary.of(r.e2e_s for r in ok)
    gaps = [gap for r in ok for gap in r.itl_s]
    itl = LatencySummary.of(gaps)
    statuses = Counter(r.status if r.status != 200 or r.complete else "200_incomplete" for r in results)
    return {
        "requests": len(results),
        "ok": len(ok),
        "success_rate": len(ok) / len(results) if results else 0.0,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "ttft_ms": {k: None if v is None else round(v * 1000, 1) for k, v in ttft.to_json(6).items()},
        "e2e_ms": {k: None if v is None else round(v * 1000, 1) for k, v in e2e.to_json(6).items()},
        "itl_ms": {k: None if v is None else round(v * 1000, 1) for k, v in itl.to_json(6).items()},
        "largest_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,  # between two chunks of a stream
    }


def summarize(
    alone: list[StreamResult],
    attacked: list[StreamResult],
    counts: dict[str, Counter[int]],
    idle: dict[str, float],
    flood: str | None = None,
) -> dict[str, Any]:
    """The JSON report, with the issue's targets checked (a flood's: TTFT p50 within 1.5x)."""
    a, b = _phase_report(alone), _phase_report(attacked)
    ratio = _ratio(a["ttft_ms"]["p99"], b["ttft_ms"]["p99"])
    p50_ratio = _ratio(a["ttft_ms"]["p50"], b["ttft_ms"]["p50"])
    itl_ratios = {q: _ratio(a["itl_ms"][q], b["itl_ms"][q]) for q in ("p50", "p99")}
    gap_ratio = _ratio(a["largest_gap_ms"], b["largest_gap_ms"])
    attacker = {name: {str(k): v for k, v in sorted(c.items())} for name, c in sorted(counts.items())}
    num_5xx = sum(v for c in counts.values() for k, v in c.items() if 500 <= k < 600)
    targets: dict[str, Any] = {
        "victim_success_100pct": b["success_rate"] == 1.0 and a["success_rate"] == 1.0,
        "ttft_p99_within_1_2x": ratio is not None and ratio <= 1.2,  # issue 10
        "ttft_p99_within_1_5x": ratio is not None and ratio <= 1.5,  # issue 24 (every input, SmolLM2)
        "attacker_5xx": num_5xx,
    }
    if flood is not None:
        targets["ttft_p50_within_1_5x"] = p50_ratio is not None and p50_ratio <= 1.5
    return {
        "alone": a,
        "attacked": b,
        "flood": flood,
        "ttft_p99_ratio": None if ratio is None else round(ratio, 3),
        "ttft_p50_ratio": None if p50_ratio is None else round(p50_ratio, 3),
        "itl_p50_ratio": None if itl_ratios["p50"] is None else round(itl_ratios["p50"], 3),
        "itl_p99_ratio": None if itl_ratios["p99"] is None else round(itl_ratios["p99"], 3),
        "largest_gap_ratio": None if gap_ratio is None else round(gap_ratio, 3),
        "targets": targets,
        "attacker": attacker,
        "idle_after": idle,
    }


def _ratio(alone: float | None, attacked: float | None) -> float | None:
    return attacked / alone if alone and attacked else None


def markdown(report: dict[str, Any], command: str) -> str:
    """The Markdown summary."""
    lines = [
        "# Attacker benchmark",
        "",
        f"`{command}`",
        "",
        "| victim | requests | success | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | largest gap ms "
        "| e2e p50 ms | e2e p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in ("alone", "attacked"):
        p = report[phase]
        lines.append(
            f"| {phase} | {p['requests']} | {p['success_rate'] * 100:.1f}% | {p['ttft_ms']['p50']} | "
            f"{p['ttft_ms']['p99']} | {p['itl_ms']['p50']} | {p['itl_ms']['p99']} | "
            f"{p.get('largest_gap_ms')} | {p['e2e_ms']['p50']} | {p['e2e_ms']['p99']} |"
        )
    t = report["targets"]
    lines += [
        "",
        f"TTFT p99 attacked / alone: **{report['ttft_p99_ratio']}** (issue 10's target <= 1.2: "
        f"{'met' if t['ttft_p99_within_1_2x'] else 'NOT met'}; issue 24's <= 1.5: "
        f"{'met' if t['ttft_p99_within_1_5x'] else 'NOT met'}); victim success 100%: "
        f"{'met' if t['victim_success_100pct'] else 'NOT met'}; attacker 5xx: {t['attacker_5xx']}.",
        "",
        f"ITL attacked / alone: p50 **{report['itl_p50_ratio']}**, p99 **{report['itl_p99_ratio']}** "
        "(the front end's load reaching the streams already running).",
    ]
    if report.get("flood"):
        lines += [
            "",
            f"Flood `{report['flood']}`: TTFT p50 attacked / alone: **{report['ttft_p50_ratio']}** "
            f"(target <= 1.5: {'met' if t['ttft_p50_within_1_5x'] else 'NOT met'}); TTFT p99 "
            f"**{report['ttft_p99_ratio']}**; largest chunk gap **{report.get('largest_gap_ratio')}**.",
        ]
    lines += [
        "",
        "| attacker input | answers (status: count; 0 = cancelled by the client) |",
        "|---|---|",
    ]
    for name, statuses in report["attacker"].items():
        lines.append(f"| {name} | {', '.join(f'{k}: {v}' for k, v in statuses.items())} |")
    return "\n".join(lines) + "\n"


def _wait_idle(server: WeirProcess, timeout_s: float = 60) -> dict[str, float]:
    names: tuple[str, ...] = ("weir_num_requests_running", "weir_num_requests_waiting")
    names += ("weir_kv_cache_free_blocks", "weir_kv_cache_total_blocks")
    deadline = time.monotonic() + timeout_s
    while True:
        g = scrape_gauges(server.metrics_url, names)
        idle = g[names[0]] == 0 and g[names[1]] == 0 and g[names[2]] == g[names[3]]
        if idle or time.monotonic() > deadline:
            return {**g, "idle": float(idle)}
        time.sleep(0.5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.attacker", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=Path("bench-out/attacker"))
    p.add_argument("--model", type=Path, default=None, help="default: a random 2-layer Llama")
    p.add_argument("--requests", type=int, default=120, help="victim requests per phase and round")
    p.add_argument("--rate", type=float, default=4.0, help="victim requests per second")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--attackers", type=int, default=4, help="concurrent attacker clients")
    p.add_argument(
        "--probes",
        type=lambda v: v.split(","),
        default=[p.name for p in HOSTILE],
        help=f"comma-separated inputs the attacker loops (default all: {','.join(p.name for p in HOSTILE)})",
    )
    p.add_argument(
        "--flood",
        choices=list(FLOOD_PROBES),
        default=None,
        help="loop this flood (issue 21's, or issue 54's costly requests: regex, logit-bias, stop, "
        "logprobs; plain: the same chats with no costly field, the control) from --attackers "
        "connections instead of --probes",
    )
    p.add_argument("--rounds", type=int, default=1, help="(alone, attacked) pairs, pooled per phase")
    p.add_argument("--kv-cache-tokens", type=int, default=4096)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--attacker-tokens-per-minute",
        type=int,
        default=30_000,
        help="the attacker's budget (a modest tenant)",
    )
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more `weir serve` argument (repeat; e.g. --serve-arg=--gil-switch-interval-ms --serve-arg=5)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import shlex
    import sys

    args = parse_args(argv)
    unknown = set(args.probes) - {p.name for p in HOSTILE}
    if unknown:
        raise SystemExit(f"unknown --probes: {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        ["python", "-m", "weir_bench.experiments.attacker", *(sys.argv[1:] if argv is None else argv)]
    )
    model = resolve_model(args.model, args.out)
    flags = ["--kv-cache-tokens", str(args.kv_cache_tokens), "--max-model-len", str(args.max_model_len)]
    flags += ["--device", "cpu"] if args.model is None else []
    flags += args.serve_arg
    specs = [
        TenantSpec(VICTIM, quota={"tokens_per_minute": 10_000_000}),
        TenantSpec(ATTACKER, quota={"tokens_per_minute": args.attacker_tokens_per_minute}),
    ]
    alone: list[StreamResult] = []
    attacked: list[StreamResult] = []
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    with run_weir(model, args.out / "data", flags, log_path=args.out / "server.log") as server:

        async def run() -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                keys = await create_tenants(client, server.url, server.admin_token, specs)
            warm = argparse.Namespace(**{**vars(args), "requests": 8})
            await _victim(warm, server, keys[VICTIM], model.name)  # warm-up, not counted
            for round_index in range(args.rounds):
                for is_attacked in (False, True):
                    print(f"round {round_index + 1}: {'attacked' if is_attacked else 'alone'}", flush=True)
                    results, phase_counts = await _phase(args, server, keys, model.name, is_attacked)
                    (attacked if is_attacked else alone).extend(results)
                    for name, c in phase_counts.items():
                        counts[name].update(c)

        asyncio.run(run())
        report = summarize(alone, attacked, counts, _wait_idle(server), args.flood)
    report["command"] = command
    (args.out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "summary.md").write_text(markdown(report, command))
    print(markdown(report, command), flush=True)
    t = report["targets"]
    if args.flood:  # a flood's target is the p50 (the figure); its p99 is reported
        return 0 if t["victim_success_100pct"] and t["ttft_p50_within_1_5x"] and t["attacker_5xx"] == 0 else 1
    return 0 if t["victim_success_100pct"] and t["ttft_p99_within_1_2x"] and t["attacker_5xx"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
