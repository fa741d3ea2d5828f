"""`python -m bench.experiments.serve_vs_peer`: Weir served live against OpenAI-compatible peers, one run.

Each system is started alone, loaded by guidellm through `../shared/tools/guidellm.sh` with the
same settings (issue 13's table: 48 requests, 8 concurrent streams, 128-token prompts, 64 output
tokens, `/v1/completions` streaming), and stopped before the next starts:

- peers from `../shared/tools/`: `tserve` (`peer-tserve.sh`, transformers serve with continuous
  batching), `llama` (`peer-llama.sh`, llama-server on the fp32 GGUF), `llama-q4` (its Q4_1 GGUF);
- Weir variants: `weir serve --dtype float32` with a tenant key, plus each variant's flags and
  environment (`--weir NAME=FLAGS`, e.g. `step200=--target-step-ms 200`; a `VAR=value` word is
  put in the server's environment instead, e.g. `1thread=OMP_NUM_THREADS=1`).

Prints and writes (`--out`/summary.md, summary.json) output tok/s, ITL p50/p99, TTFT p50/p99 per
system and Weir's ratios to each peer against the issue's targets. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from bench.experiments.prefill_overlap import prefills_in_decode, request_times
from bench.tenants import TenantSpec, create_tenants
from bench.weir_process import ROOT, free_port, parse_gauges, run_weir

# ../shared/tools from the main checkout, ../../shared/tools from a worktree under wt/
DEFAULT_TOOLS = next(
    (p / "shared" / "tools" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared" / "tools").is_dir()),
    ROOT.parent / "shared" / "tools",
)
PEERS = {"tserve": ("peer-tserve.sh",), "llama": ("peer-llama.sh",), "llama-q4": ("peer-llama.sh", "q4")}
TENANT = "bench-peer"
STEP_BUDGET_GAUGES = (
    "weir_scheduler_token_budget",
    "weir_scheduler_target_step_seconds",
    "weir_scheduler_step_cost_per_token_seconds",
    "weir_scheduler_step_overhead_seconds",
    "weir_scheduler_step_cost_per_decode_seconds",
    "weir_scheduler_max_running",
    "weir_scheduler_step_margin",
    "weir_scheduler_step_fit_resets_total",
)


@dataclass(frozen=True)
class ServeFigures:
    """What guidellm measured for one system."""

    system: str
    output_tok_s: float
    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    num_ok: int
    num_errored: int
    wall_s: float
    server_gauges: dict[str, float] = field(default_factory=dict)  # Weir's step budget after the run
    # other requests' first tokens inside a request's decode, mean (bench/experiments/prefill_overlap.py)
    prefills_in_decode: float | None = None


def _stat(metrics: Mapping[str, Any], name: str, key: str) -> float:
    summary = metrics[name]["successful"]
    if key.startswith("p"):
        return float(summary["percentiles"][key])
    return float(summary[key])


def parse_guidellm(system: str, report: Mapping[str, Any], wall_s: float) -> ServeFigures:
    """The figures of guidellm 0.8.1's benchmarks.json (one benchmark)."""
    bench = report["benchmarks"][0]
    m = bench["metrics"]
    totals = m["request_totals"]
    return ServeFigures(
        system=system,
        output_tok_s=_stat(m, "output_tokens_per_second", "mean"),
        itl_p50_ms=_stat(m, "inter_token_latency_ms", "median"),
        itl_p99_ms=_stat(m, "inter_token_latency_ms", "p99"),
        ttft_p50_ms=_stat(m, "time_to_first_token_ms", "median"),
        ttft_p99_ms=_stat(m, "time_to_first_token_ms", "p99"),
        num_ok=int(totals["successful"]),
        num_errored=int(totals["errored"]),
        wall_s=round(wall_s, 1),
        prefills_in_decode=prefills_in_decode(request_times(report)),
    )


def run_guidellm(
    args: argparse.Namespace, system: str, base_url: str, model: str, api_key: str | None
) -> ServeFigures:
    """One bounded guidellm run against `base_url`."""
    out = args.out / system
    env = {
        **os.environ,
        "N": str(args.requests),
        "STREAMS": str(args.streams),
        "PROMPT": str(args.prompt_tokens),
        "MAXTOK": str(args.max_tokens),
        "MODEL": model,
    }
    env.pop("APIKEY", None)
    if api_key:
        env["APIKEY"] = api_key
    cmd = ["bash", str(args.tools / "guidellm.sh"), base_url, str(args.model), str(out)]
    t0 = time.monotonic()
    with (args.out / f"{system}.guidellm.log").open("wb") as log:
        # its own session: on timeout the whole group goes (guidellm's worker processes too)
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=args.run_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, cmd)
    figures = parse_guidellm(system, json.loads((out / "benchmarks.json").read_text()), time.monotonic() - t0)
    print(f"{system}: {figures}", flush=True)
    return figures


@contextmanager
def run_peer(args: argparse.Namespace, name: str) -> Iterator[tuple[str, str]]:
    """Start a peer with its shared tool script; yields its base URL and the model name to ask for
    (`peer-tserve.sh` prints its model folder; llama-server answers any name); stops it on exit."""
    script, *extra = PEERS[name]
    port = free_port()
    proc = subprocess.run(
        ["bash", str(args.tools / script), str(port), *extra],
        capture_output=True,
        text=True,
        timeout=args.peer_start_timeout_s,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{name} did not start: {proc.stderr.strip()[-2000:]}")
    words = proc.stdout.split()
    pid = int(words[0])
    try:
        yield f"http://127.0.0.1:{port}", (words[1] if len(words) > 1 else "default")
    finally:
        try:
            os.killpg(pid, signal.SIGTERM)  # the scripts start the server with setsid
        except ProcessLookupError:
            pass
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)


def parse_variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    """`NAME=FLAGS` -> (name, weir flags, environment); a `VAR=value` word goes to the environment."""
    name, _, rest = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"--weir needs NAME=FLAGS, got {text!r}")
    flags: list[str] = []
    env: dict[str, str] = {}
    for word in shlex.split(rest):
        if not word.startswith("-") and "=" in word:
            key, _, value = word.partition("=")
            env[key] = value
        else:
            flags.append(word)
    return name, flags, env


def run_weir_variant(
    args: argparse.Namespace, name: str, flags: list[str], env: dict[str, str]
) -> ServeFigures:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # run_weir passes this process's environment to the server
    try:
        server_flags = ["--dtype", "float32", "--device", "cpu", *flags]
        with run_weir(
            args.model, args.out / f"data-{name}", server_flags, log_path=args.out / f"{name}.log"
        ) as w:

            async def key() -> str:
                async with httpx.AsyncClient(timeout=30) as client:
                    spec = TenantSpec(TENANT, quota={"tokens_per_minute": 100_000_000})
                    return (await create_tenants(client, w.url, w.admin_token, [spec]))[TENANT]

            api_key = asyncio.run(key())
            figures = run_guidellm(args, name, w.url, args.served_name, api_key)
            page = httpx.get(w.metrics_url, timeout=10).raise_for_status().text
            gauges = {**parse_gauges(page, STEP_BUDGET_GAUGES), **gc_pause_totals(page)}
            print(f"{name}: {gauges}", flush=True)
            return replace(figures, server_gauges=gauges)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def gc_pause_totals(page: str) -> dict[str, float]:
    """`gc<generation>_count` and `gc<generation>_s` from `weir_gc_pause_seconds` on a metrics page:
    the garbage collections the server stood still for during its life, and their seconds."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            generation = sample.labels.get("generation")
            if generation is None or not sample.name.startswith("weir_gc_pause_seconds_"):
                continue
            if sample.name.endswith("_count"):
                totals[f"gc{generation}_count"] = sample.value
            elif sample.name.endswith("_sum"):
                totals[f"gc{generation}_s"] = sample.value
    return totals


def ratios(weir: ServeFigures, peer: ServeFigures) -> dict[str, float]:
    """Weir over the peer: throughput (higher is better), ITL and TTFT p50 (lower is better)."""
    return {
        "output_tok_s": round(weir.output_tok_s / peer.output_tok_s, 2),
        "itl_p50": round(weir.itl_p50_ms / peer.itl_p50_ms, 2),
        "ttft_p50": round(weir.ttft_p50_ms / peer.ttft_p50_ms, 2),
    }


def markdown(rows: Sequence[ServeFigures], weir_names: Sequence[str], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "| server | output tok/s | ITL p50 ms | ITL p99 ms | TTFT p50 ms | TTFT p99 ms | ok / errors | wall s "
        "| prefills in a decode |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        overlap = "-" if r.prefills_in_decode is None else f"{r.prefills_in_decode:.1f}"
        lines.append(
            f"| {r.system} | {r.output_tok_s:.1f} | {r.itl_p50_ms:.0f} | {r.itl_p99_ms:.0f} | {r.ttft_p50_ms:,.0f} "
            f"| {r.ttft_p99_ms:,.0f} | {r.num_ok} / {r.num_errored} | {r.wall_s} | {overlap} |"
        )
    lines.append(
        "\nPrefills in a decode: other requests' first tokens inside a request's decode window, mean "
        "(bench/experiments/prefill_overlap.py); their prefill steps are in its ITL."
    )
    for r in rows:
        if r.server_gauges:
            g = r.server_gauges
            lines.append(
                f"\n{r.system} after the run: token budget {g.get('weir_scheduler_token_budget', 0):.0f}, "
                f"target {g.get('weir_scheduler_target_step_seconds', 0) * 1e3:.0f} ms, fitted "
                f"{g.get('weir_scheduler_step_overhead_seconds', 0) * 1e3:.1f} ms + "
                f"{g.get('weir_scheduler_step_cost_per_decode_seconds', 0) * 1e3:.2f} ms/decode + "
                f"{g.get('weir_scheduler_step_cost_per_token_seconds', 0) * 1e3:.2f} ms/prefill token, "
                f"margin {g.get('weir_scheduler_step_margin', 0):.0%}, running cap "
                + (f"{g['weir_scheduler_max_running']:.0f}" if "weir_scheduler_max_running" in g else "none")
                + f", fits dropped {g.get('weir_scheduler_step_fit_resets_total', 0):.0f}"
            )
            if any(key.startswith("gc") for key in g):
                lines.append(
                    f"{r.system} garbage collections over its life: "
                    + ", ".join(
                        f"generation {gen} {g.get(f'gc{gen}_count', 0):.0f} ({g.get(f'gc{gen}_s', 0) * 1e3:.0f} ms)"
                        for gen in range(3)
                    )
                )
    peers = [r for r in rows if r.system not in weir_names]
    weirs = [r for r in rows if r.system in weir_names]
    if peers and weirs:
        lines += [
            "",
            "| Weir variant / peer | tok/s ratio | ITL p50 ratio | TTFT p50 ratio |",
            "|---|---|---|---|",
        ]
        for w in weirs:
            for p in peers:
                r = ratios(w, p)
                lines.append(
                    f"| {w.system} / {p.system} | {r['output_tok_s']} | {r['itl_p50']} | {r['ttft_p50']} |"
                )
        lines += [
            "",
            "Targets: vs tserve tok/s >= 2, ITL p50 <= 0.5, TTFT p50 <= 1; vs llama (fp32) tok/s >= 0.8, ITL p50 <= 1.5.",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.experiments.serve_vs_peer", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=Path("bench-out/serve-vs-peer"))
    p.add_argument("--model", type=Path, default=Path.home() / ".cache/weir/models/SmolLM2-135M-Instruct")
    p.add_argument("--served-name", default=None, help="model name Weir serves (default: the folder's name)")
    p.add_argument("--peers", nargs="*", default=["tserve", "llama"], choices=sorted(PEERS))
    p.add_argument(
        "--weir",
        nargs="*",
        type=parse_variant,
        default=[parse_variant("weir=")],
        metavar="NAME=FLAGS",
        help="Weir variants, e.g. weir= step200='--target-step-ms 200' (default: weir=)",
    )
    p.add_argument("--tools", type=Path, default=DEFAULT_TOOLS, help="the shared tools folder")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--run-timeout-s", type=float, default=900.0, help="bound on one guidellm run")
    p.add_argument(
        "--peer-start-timeout-s", type=float, default=1800.0, help="bound on a peer's start (build)"
    )
    args = p.parse_args(argv)
    args.served_name = args.served_name or args.model.name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        ["python", "-m", "bench.experiments.serve_vs_peer", *(sys.argv[1:] if argv is None else argv)]
    )
    rows: list[ServeFigures] = []
    for name in args.peers:
        try:
            with run_peer(args, name) as (url, model):
                rows.append(run_guidellm(args, name, url, model, None))
        except (RuntimeError, subprocess.SubprocessError, OSError, KeyError) as exc:
            print(f"{name}: not measured: {exc}", flush=True)
    for name, flags, env in args.weir:
        rows.append(run_weir_variant(args, name, flags, env))
    text = markdown(rows, [v[0] for v in args.weir], command)
    (args.out / "summary.json").write_text(
        json.dumps({"command": command, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    (args.out / "summary.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
