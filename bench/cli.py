"""Command line of the serving benchmark: `bench serve`, `compare`, `gen` and `overhead`.

`add_subcommands(subparsers)` adds them to the `bench` command's subparsers (the `weir` CLI
calls it); each sets `func`, a handler taking the parsed args and returning an exit status.
`python -m weir_bench ...` runs the same commands without the rest of `weir`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weir_bench.arrivals import ArrivalMode, ArrivalSpec
from weir_bench.compare import compare_reports, comparison_json, format_table, load_report
from weir_bench.generators import LengthDist, LengthKind, multi_turn, random_lengths, shared_prefix
from weir_bench.loadgen import BodyOptions, LoadOptions
from weir_bench.metadata import redacted_command
from weir_bench.report import SLO
from weir_bench.serve import BenchSetupError, ServeConfig, run_serve
from weir_bench.workloads import RequestKind, save_trace


def _label(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"--label wants key=value, got {text!r}")
    return key, value


def _add_serve(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="load-test an OpenAI-compatible server with a trace")
    p.add_argument(
        "--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 (a /v1 suffix is fine)"
    )
    p.add_argument("--workload", required=True, type=Path, help="JSONL trace (see shared/workloads)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    auth = p.add_argument_group("keys")
    auth.add_argument("--api-key", help="key for every request (fallback for tenants without one)")
    auth.add_argument("--tenants", type=Path, help="tenants file; per-tenant keys from its api_key fields")
    auth.add_argument(
        "--create-tenants", action="store_true", help="create the tenants and keys via the admin API"
    )
    auth.add_argument("--admin-token", help="admin bearer token for --create-tenants")
    auth.add_argument("--admin-url", help="admin API root (default: the --url root)")
    p.add_argument("--limit", type=int, help="send only the first N requests (by arrival time)")
    arr = p.add_mutually_exclusive_group()
    arr.add_argument("--rate-scale", type=float, help="trace arrivals, rate multiplied by X (default 1)")
    arr.add_argument("--rate", type=float, help="Poisson arrivals at R requests/s (trace order kept)")
    arr.add_argument("--concurrency", type=int, help="closed loop: C requests in flight")
    p.add_argument("--seed", type=int, default=0, help="seed of Poisson arrivals")
    p.add_argument("--ttft-slo-ms", type=float, help="TTFT objective for goodput")
    p.add_argument("--tpot-slo-ms", type=float, help="TPOT objective for goodput")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per-request limit (default 120)")
    p.add_argument("--max-duration-s", type=float, default=3600.0, help="whole-run limit (default 3600)")
    p.add_argument(
        "--label", type=_label, action="append", default=[], help="metadata key=value (repeatable)"
    )
    p.add_argument("--no-priority", action="store_true", help="do not send the priority field (for peers)")
    p.add_argument(
        "--no-ignore-eos", action="store_true", help="do not send the ignore_eos field (for peers)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=serve_command)


def _arrival(args: argparse.Namespace) -> ArrivalSpec:
    if args.rate is not None:
        return ArrivalSpec(mode=ArrivalMode.POISSON, rate=args.rate, seed=args.seed)
    if args.concurrency is not None:
        return ArrivalSpec(mode=ArrivalMode.CONCURRENCY, concurrency=args.concurrency)
    return ArrivalSpec(
        mode=ArrivalMode.TRACE, rate_scale=args.rate_scale if args.rate_scale is not None else 1.0
    )


def serve_config(args: argparse.Namespace, argv: Sequence[str] | None = None) -> ServeConfig:
    """ServeConfig from parsed `bench serve` flags; raises ValueError naming a bad flag."""
    return ServeConfig(
        url=args.url,
        workload=args.workload,
        out_dir=args.out,
        arrival=_arrival(args),
        options=LoadOptions(
            timeout_s=args.timeout_s, max_duration_s=args.max_duration_s, progress=not args.no_progress
        ),
        slo=SLO(ttft_ms=args.ttft_slo_ms, tpot_ms=args.tpot_slo_ms),
        model=args.model,
        api_key=args.api_key,
        tenants_file=args.tenants,
        create_tenants=args.create_tenants,
        admin_token=args.admin_token,
        admin_url=args.admin_url,
        limit=args.limit,
        labels=dict(args.label),
        body_options=BodyOptions(send_priority=not args.no_priority, send_ignore_eos=not args.no_ignore_eos),
        command=redacted_command(argv),
    )


def serve_command(args: argparse.Namespace) -> int:
    """Run `bench serve`; 0 once the report is written (failed requests are in it), 2 on bad setup."""
    try:
        config = serve_config(args, getattr(args, "argv", None))
        result = asyncio.run(run_serve(config))
    except (ValueError, OSError, BenchSetupError) as exc:
        print(f"bench serve: {exc}", file=sys.stderr)
        return 2
    overall = result.report["overall"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    print(
        f"{overall['ok']}/{overall['requests']} ok, errors {overall['errors_by_status'] or '-'}, "
        f"TTFT p50 {ms(overall['ttft_ms']['p50'])}, TPOT p50 {ms(overall['tpot_ms']['p50'])}, "
        f"{overall['output_tokens_per_s']:.1f} output tok/s; report in {config.out_dir}"
    )
    return 0


def _add_compare(subparsers: Any) -> None:
    p = subparsers.add_parser("compare", help="ratios B/A per metric of two bench serve reports")
    p.add_argument("a", type=Path, help="report.json (or its directory): the baseline")
    p.add_argument("b", type=Path, help="report.json (or its directory): the candidate")
    p.add_argument("--out", type=Path, help="also write the comparison as JSON here")
    p.add_argument("--same-within", type=float, default=0.02, help="relative change counted as same (0.02)")
    p.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    """Print the comparison table (and write JSON with --out)."""
    try:
        rows = compare_reports(load_report(args.a), load_report(args.b), args.same_within)
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench compare: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(comparison_json(rows, str(args.a), str(args.b)), indent=2) + "\n")
    return 0


def _add_gen(subparsers: Any) -> None:
    p = subparsers.add_parser("gen", help="write a synthetic trace (random, shared-prefix, multi-turn)")
    p.add_argument("kind", choices=["random", "shared-prefix", "multi-turn"])
    p.add_argument("--out", required=True, type=Path, help="JSONL file to write")
    p.add_argument("--n", type=int, default=100, help="requests (sessions for multi-turn)")
    p.add_argument("--rate", type=float, default=4.0, help="arrivals (sessions) per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tenants", default="default", help="comma-separated tenant names")
    p.add_argument("--priority", choices=["interactive", "standard", "batch"])
    p.add_argument("--prompt-words", type=int, default=90, help="median prompt (user turn) length in words")
    p.add_argument("--output-tokens", type=int, default=48, help="median max_tokens")
    p.add_argument("--sigma", type=float, default=0.8, help="lognormal sigma of lengths (0: fixed)")
    p.add_argument("--completion", action="store_true", help="random: /v1/completions instead of chat")
    p.add_argument("--num-prefixes", type=int, default=2, help="shared-prefix: prompts per tenant")
    p.add_argument("--prefix-words", type=int, default=450, help="shared-prefix: words per shared prompt")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per session")
    p.add_argument("--think-time-s", type=float, default=1.0, help="multi-turn: pause between turns")
    p.add_argument("--reply-words", type=int, default=40, help="multi-turn: words per assistant turn")
    p.add_argument("--system-words", type=int, default=0, help="multi-turn: system prompt words")
    p.set_defaults(func=gen_command)


def _dist(median: int, sigma: float, hi: int) -> LengthDist:
    kind = LengthKind.FIXED if sigma == 0 else LengthKind.LOGNORMAL
    return LengthDist(kind=kind, median=median, lo=1, hi=max(hi, median), sigma=sigma)


def gen_command(args: argparse.Namespace) -> int:
    """Write the requested synthetic trace."""
    tenants = [t for t in args.tenants.split(",") if t]
    try:
        prompt = _dist(args.prompt_words, args.sigma, 8 * args.prompt_words)
        output = _dist(args.output_tokens, args.sigma, 8 * args.output_tokens)
        if args.kind == "random":
            kind = RequestKind.COMPLETION if args.completion else RequestKind.CHAT
            reqs = random_lengths(
                args.n,
                rate=args.rate,
                prompt_words=prompt,
                output_tokens=output,
                tenants=tenants,
                kind=kind,
                priority=args.priority,
                seed=args.seed,
            )
        elif args.kind == "shared-prefix":
            reqs = shared_prefix(
                args.n,
                rate=args.rate,
                num_prefixes=args.num_prefixes,
                prefix_words=args.prefix_words,
                suffix_words=prompt,
                output_tokens=output,
                tenants=tenants,
                priority=args.priority,
                seed=args.seed,
            )
        else:
            reqs = multi_turn(
                args.n,
                turns=args.turns,
                session_rate=args.rate,
                think_time_s=args.think_time_s,
                user_words=prompt,
                reply_words=_dist(args.reply_words, args.sigma, 8 * args.reply_words),
                output_tokens=output,
                system_words=args.system_words,
                tenants=tenants,
                priority=args.priority,
                seed=args.seed,
            )
    except ValueError as exc:
        print(f"bench gen: {exc}", file=sys.stderr)
        return 2
    save_trace(reqs, args.out)
    print(f"{len(reqs)} requests written to {args.out}")
    return 0


def _add_overhead(subparsers: Any) -> None:
    from weir_bench.overhead_command import add_arguments

    p = subparsers.add_parser("overhead", help="time the gateway adds per request, over a zero-cost engine")
    add_arguments(p)


def add_subcommands(subparsers: Any) -> None:
    """Add `serve`, `compare`, `gen` and `overhead` to the subparsers of a `bench` command."""
    _add_serve(subparsers)
    _add_compare(subparsers)
    _add_gen(subparsers)
    _add_overhead(subparsers)


def build_parser(prog: str = "python -m weir_bench") -> argparse.ArgumentParser:
    """A standalone `bench` parser (what `python -m weir_bench` uses)."""
    parser = argparse.ArgumentParser(prog=prog, description="Weir serving benchmarks")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m weir_bench`."""
    args = build_parser().parse_args(argv)
    if argv is not None:  # called from code: record this command line, not the host process's
        args.argv = ["python", "-m", "weir_bench", *argv]
    return int(args.func(args))
