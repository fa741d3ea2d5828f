"""`weir bench overhead`: run the benchmark of `weir_bench.gateway_overhead` and write its report.

For each auth mode a fresh benchmark server runs every scenario; the figures go to
`report.json` and `report.md` in the output folder, and the main ones are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from weir.gateway.server.uvicorn_runner import uvicorn_config
from weir.gateway.settings.settings import Settings
from weir_bench.gateway_overhead import (
    AuthSetup,
    LoadClient,
    OverheadConfig,
    PhaseResult,
    Scenario,
    benchmark_server,
    run_server_phases,
)
from weir_bench.metadata import git_commit, machine_info, now_utc, redacted_command

_LITELLM_PUBLISHED = "LiteLLM publishes 2 ms p50 / 13 ms p99 added latency at ~1,170 RPS over 4 instances"
_TARGET = "issue 3 target: p50 <= 2 ms at 200 requests/s on the 2-core machine; p99 below 13 ms"


# -- the report ----------------------------------------------------------------------------------


def _minus(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if a[k] is None or b.get(k) is None else round(a[k] - b[k], 3) for k in a}  # type: ignore[operator]


def build_report(
    config: OverheadConfig, results: dict[AuthSetup, list[PhaseResult]], meta: dict[str, Any]
) -> dict[str, Any]:
    """The report's JSON: config, metadata, per auth mode and scenario, and the overhead figures."""
    servers: dict[str, dict[str, Any]] = {}
    overhead: dict[str, dict[str, Any]] = {}
    for auth, phases in results.items():
        by_name = {p.scenario.value: p.to_json() for p in phases}
        servers[auth.value] = by_name
        floor = by_name.get(Scenario.HEALTH.value)
        overhead[auth.value] = {}
        for name, phase in by_name.items():
            if name == Scenario.HEALTH.value:
                continue
            figures = {
                "raw_ms": phase["latency_ms"],
                "minus_floor_ms": _minus(phase["latency_ms"], floor["latency_ms"]) if floor else None,
                "in_app_ms": phase["in_app_ms"],
            }
            if phase["first_chunk_ms"] is not None:
                # What a streaming client feels first: the TTFT the gateway adds.
                figures["first_chunk_ms"] = phase["first_chunk_ms"]
                figures["first_chunk_minus_floor_ms"] = (
                    _minus(phase["first_chunk_ms"], floor["latency_ms"]) if floor else None
                )
            overhead[auth.value][name] = figures
    return {
        "config": {
            "model": str(config.model),
            "rate": config.rate,
            "requests_per_scenario": config.num_requests,
            "max_duration_s": config.max_duration_s,
            "warmup_per_scenario": config.num_warmup,
            "output_tokens": config.output_tokens,
            "auth": [a.value for a in config.auth],
            "scenarios": [s.value for s in config.scenarios],
            "timeout_s": config.timeout_s,
            "client": config.client.value,
            "admission": config.admission,
            "gil_switch_interval_ms": config.gil_switch_interval_ms,
        },
        "metadata": meta,
        "servers": servers,
        "overhead": overhead,
        "reference": {"target": _TARGET, "litellm": _LITELLM_PUBLISHED + " (not measured here)"},
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    meta, cfg = report["metadata"], report["config"]
    machine = meta["machine"]
    lines = [
        "# Gateway overhead (null engine)",
        "",
        f"- date: {meta['date']}; commit: `{meta['commit']}`",
        f"- command: `{meta['command']}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB; "
        f"load average before: {meta['load_average_before']}",
        f"- server: uvicorn loop `{meta['uvicorn_loop']}`, http `{meta['uvicorn_http']}`, "
        f"python {machine['python']}",
        f"- {cfg['rate']} requests/s, evenly spaced, open loop; {cfg['requests_per_scenario']} per scenario "
        f"(at most {cfg['max_duration_s']} s) after {cfg['warmup_per_scenario']} warm-up; "
        f"{cfg['output_tokens']} tokens per answer; tokenizer of `{cfg['model']}`; "
        f"load client `{cfg['client']}`; admission {'on' if cfg['admission'] else 'off'}"
        + (
            f"; GIL switch interval {cfg['gil_switch_interval_ms']} ms"
            if cfg.get("gil_switch_interval_ms") is not None
            else ""
        ),
        "",
        "Latency is client-measured (send to whole body read) against a zero-cost engine, so all of it",
        "is overhead. The floor is `GET /health` at the same rate. In-app: the time inside the ASGI app",
        "(server clock). Server CPU: the server process's CPU time per request.",
        "",
        "| auth | request | ok/sent | p50 | p90 | p99 | mean | p50 − floor | p99 − floor "
        "| in-app p50 | in-app p99 | server CPU/req | send lag p99 | load 1m |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for auth, phases in report["servers"].items():
        floor = phases.get(Scenario.HEALTH.value)
        for name, p in phases.items():
            lat, app = p["latency_ms"], p["in_app_ms"]
            minus = _minus(lat, floor["latency_ms"]) if floor and name != Scenario.HEALTH.value else None
            lines.append(
                f"| {auth} | {name} | {p['ok']}/{p['sent']} | {_ms(lat['p50'])} | {_ms(lat['p90'])} "
                f"| {_ms(lat['p99'])} | {_ms(lat['mean'])} | {_ms(minus['p50']) if minus else '-'} "
                f"| {_ms(minus['p99']) if minus else '-'} | {_ms(app['p50'])} | {_ms(app['p99'])} "
                f"| {_ms(p['server_cpu_ms_per_request'])} | {_ms(p['send_lag_ms']['p99'])} "
                f"| {p['load_average_1m']} |"
            )
    lines += [
        "",
        "Streams, time to the first body chunk (role and first token; what the gateway adds to TTFT):",
        "",
        "| auth | p50 | p90 | p99 | p50 − floor | p99 − floor |",
        "|---|---|---|---|---|---|",
    ]
    for auth, scenarios in report["overhead"].items():
        for figures in scenarios.values():
            if "first_chunk_ms" not in figures:
                continue
            first, minus = figures["first_chunk_ms"], figures["first_chunk_minus_floor_ms"] or {}
            lines.append(
                f"| {auth} | {_ms(first['p50'])} | {_ms(first['p90'])} | {_ms(first['p99'])} "
                f"| {_ms(minus.get('p50'))} | {_ms(minus.get('p99'))} |"
            )
    lines += [
        "",
        "All times in ms.",
        "",
        f"- {report['reference']['target']}",
        f"- {report['reference']['litellm']}",
    ]
    return "\n".join(lines) + "\n"


# -- the run -------------------------------------------------------------------------------------


def _uvicorn_impl() -> tuple[str, str]:
    """The event loop and HTTP protocol `weir serve` configures uvicorn with."""
    config = uvicorn_config(Starlette(), Settings())
    http = config.http
    if isinstance(http, type):
        http = (
            "httptools"
            if issubclass(http, HttpToolsProtocol)
            else "h11"
            if issubclass(http, H11Protocol)
            else http.__name__
        )
    return str(config.loop), str(http)


def run_overhead(config: OverheadConfig) -> dict[str, Any]:
    """Run every auth mode and scenario; write report.json and report.md; return the report."""
    if not config.model.is_dir():
        raise ValueError(f"model: {config.model} is not a folder (a model folder with a tokenizer)")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    loop, http = _uvicorn_impl()
    meta: dict[str, Any] = {
        "date": now_utc(),
        "command": config.command,
        "commit": git_commit(),
        "machine": machine_info(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "uvicorn_loop": loop,
        "uvicorn_http": http,
    }
    results: dict[AuthSetup, list[PhaseResult]] = {}
    for auth in config.auth:
        with tempfile.TemporaryDirectory(prefix="weir-overhead-") as data_dir:
            with benchmark_server(config, auth, Path(data_dir)) as server:
                results[auth] = asyncio.run(run_server_phases(server, config))
    meta["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report = build_report(config, results, meta)
    (config.out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (config.out_dir / "report.md").write_text(format_markdown(report))
    return report


# -- command line ----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `bench overhead`."""
    p.add_argument(
        "--model", type=Path, help="model folder whose tokenizer is served (default: the default model)"
    )
    p.add_argument("--cache-dir", dest="cache_dir", help="where the default model is prepared")
    p.add_argument("--out", type=Path, default=Path("bench-out/overhead"), help="output directory")
    p.add_argument("--rate", type=float, default=200.0, help="requests/s (default 200)")
    p.add_argument("--requests", type=int, default=3000, help="measured requests per scenario (default 3000)")
    p.add_argument("--max-duration-s", type=float, default=30.0, help="per scenario (default 30)")
    p.add_argument("--warmup", type=int, default=200, help="warm-up requests per scenario (default 200)")
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per answer (default 16)")
    p.add_argument("--auth", choices=["none", "keys", "both"], default="both", help="default both")
    p.add_argument(
        "--scenarios",
        default="health,chat,chat_stream",
        help="comma-separated, of "
        + ", ".join(s.value for s in Scenario)
        + " (default health,chat,chat_stream)",
    )
    p.add_argument("--timeout-s", type=float, default=10.0, help="per request (default 10)")
    p.add_argument(
        "--client",
        choices=[c.value for c in LoadClient],
        default=LoadClient.RAW.value,
        help="load client: raw (a lean HTTP/1.1 client, default) or httpx",
    )
    p.add_argument(
        "--admission", choices=["on", "off"], default="on", help="the server's admission control (default on)"
    )
    p.add_argument(
        "--gil-switch-interval-ms",
        type=float,
        default=None,
        help="the server's GIL switch interval, as `weir serve --gil-switch-interval-ms` (default: its default)",
    )
    p.set_defaults(func=overhead_command)


def _default_model(cache_dir: str | None) -> Path:
    from weir.engine.runner.model_prepare import ensure_default_model
    from weir.gateway.settings.settings import Settings

    return ensure_default_model(Settings.from_environment({"cache_dir": cache_dir}).cache_dir)


def overhead_command(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run `bench overhead` and print the main figures; 2 on bad flags or a server that won't start."""
    auth = (AuthSetup.NONE, AuthSetup.KEYS) if args.auth == "both" else (AuthSetup(args.auth),)
    try:
        model = args.model if args.model is not None else _default_model(args.cache_dir)
        config = OverheadConfig(
            model=model,
            out_dir=args.out,
            rate=args.rate,
            num_requests=args.requests,
            max_duration_s=args.max_duration_s,
            num_warmup=args.warmup,
            output_tokens=args.output_tokens,
            auth=auth,
            scenarios=tuple(Scenario(name.strip()) for name in args.scenarios.split(",") if name.strip()),
            timeout_s=args.timeout_s,
            client=LoadClient(args.client),
            admission=args.admission == "on",
            gil_switch_interval_ms=args.gil_switch_interval_ms,
            command=redacted_command(argv if argv is not None else getattr(args, "argv", None)),
        )
        report = run_overhead(config)
    except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
        print(f"bench overhead: {exc}", file=sys.stderr)
        return 2
    for mode, scenarios in report["overhead"].items():
        for name, o in scenarios.items():
            raw, minus = o["raw_ms"], o["minus_floor_ms"] or {}
            print(
                f"auth {mode:4} {name:11}: p50 {_ms(raw['p50'])} ms, p99 {_ms(raw['p99'])} ms "
                f"(minus floor: p50 {_ms(minus.get('p50'))}, p99 {_ms(minus.get('p99'))})"
            )
    print(f"report in {config.out_dir}")
    return 0
