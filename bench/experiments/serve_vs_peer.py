"""`python -m weir_bench.experiments.serve_vs_peer`: Weir served live against OpenAI-compatible peers, one run.

Each system is started alone, loaded by guidellm through `../shared/tools/guidellm.sh` with the
same settings (issue 13's table: 48 requests, 8 concurrent streams, 128-token prompts, 64 output
tokens, `/v1/completions` streaming), and stopped before the next starts:

- peers from `../shared/tools/`: `tserve` (`peer-tserve.sh`, transformers serve with continuous
  batching), `llama` (`peer-llama.sh`, llama-server on the fp32 GGUF), `llama-q4` (its Q4_1 GGUF);
- Weir variants: `weir serve --dtype float32` with the key of one tenant of class `--tenant-class`
  (`interactive` by default, as the README creates tenants), plus each variant's flags and
  environment (`--weir NAME=FLAGS`, e.g. `step200=--target-step-ms 200`; a `VAR=value` word is
  put in the server's environment instead, e.g. `1thread=OMP_NUM_THREADS=1`).

`--rounds N` runs every system N times in alternating order (bench/experiments/alternation.py):
each ratio is taken within a round and summarised by its median over the rounds, so a slow spell
of the shared host weighs on both sides. With N > 1 each round writes under `--out`/roundK/.

Prints and writes (`--out`/summary.md, summary.json) the tenant class Weir was measured under,
output tok/s, ITL p50/p99, TTFT p50/p99 per system, the server's mean decode and prefill step from `/metrics`, and Weir's ratios to each peer
against the issue's targets. Every wait is bounded.
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
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import httpx

from weir_bench.experiments.alternation import round_orders
from weir_bench.experiments.process_cpu import TreeCPU
from weir_bench.experiments.serve_figures import (
    ServeFigures,
    admitted_by_class,
    gc_pause_totals,
    opening_window,
    parse_guidellm,
    rounds_markdown,
    step_split,
    wide_step_choices,
)
from weir_bench.tenants import TenantSpec, create_tenants
from weir_bench.weir_process import ROOT, free_port, parse_gauges, run_weir
from weir_bench.workloads import PRIORITIES

# ../shared/tools from the main checkout, ../../shared/tools from a worktree under wt/
DEFAULT_TOOLS = next(
    (p / "shared" / "tools" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared" / "tools").is_dir()),
    ROOT.parent / "shared" / "tools",
)
PEERS = {"tserve": ("peer-tserve.sh",), "llama": ("peer-llama.sh",), "llama-q4": ("peer-llama.sh", "q4")}
TENANT = "bench-peer"
OPENING_WINDOW_S = 3.0  # the opening burst's window for the CPU each side used
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


def bench_tenant(tenant_class: str) -> TenantSpec:
    """The one tenant whose key loads every Weir variant: of class `tenant_class`, with a token quota
    no run reaches (the benchmark measures serving, not admission)."""
    return TenantSpec(TENANT, priority=tenant_class, quota={"tokens_per_minute": 100_000_000})


def run_guidellm(
    args: argparse.Namespace,
    system: str,
    base_url: str,
    model: str,
    api_key: str | None,
    server_pid: int | None = None,
) -> ServeFigures:
    """One bounded guidellm run against `base_url`; with `server_pid`, the CPU guidellm and the
    server used in the opening burst's window (bench/experiments/process_cpu.py)."""
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
        roots = {"client": proc.pid, **({"server": server_pid} if server_pid is not None else {})}
        cpu = TreeCPU(roots).start()
        try:
            returncode = proc.wait(timeout=args.run_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            cpu.stop()
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, cmd)
    report = json.loads((out / "benchmarks.json").read_text())
    figures = parse_guidellm(system, report, time.monotonic() - t0)
    window = opening_window(report, OPENING_WINDOW_S)
    if window is not None and server_pid is not None:
        used = {f"{name}_cpu_s": cpu.used_s(name, *window) for name in roots}
        if all(v is not None for v in used.values()):
            opening = {**figures.opening, "window_s": OPENING_WINDOW_S, **used}
            figures = replace(figures, opening={k: v for k, v in opening.items() if v is not None})
    print(f"{system}: {figures}", flush=True)
    return figures


@contextmanager
def run_peer(args: argparse.Namespace, name: str) -> Iterator[tuple[str, str, int]]:
    """Start a peer with its shared tool script; yields its base URL, the model name to ask for
    (`peer-tserve.sh` prints its model folder; llama-server answers any name) and its pid; stops
    it on exit."""
    script, *extra = PEERS[name]
    port = free_port()
    proc = subprocess.run(
        ["bash", str(args.tools / script), str(port), *extra],
        # Not from the repository: the scripts' `python -c` and `python -` put the working
        # directory first on sys.path, where Weir's `kernels/` shadows Hugging Face's `kernels`
        # package that newer transformers import (docs/decisions.md, the transformers pin).
        cwd=tempfile.gettempdir(),
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
        yield f"http://127.0.0.1:{port}", (words[1] if len(words) > 1 else "default"), pid
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
                    spec = bench_tenant(args.tenant_class)
                    return (await create_tenants(client, w.url, w.admin_token, [spec]))[TENANT]

            api_key = asyncio.run(key())
            figures = run_guidellm(args, name, w.url, args.served_name, api_key, w.pid)
            page = httpx.get(w.metrics_url, timeout=10).raise_for_status().text
            gauges = {
                **parse_gauges(page, STEP_BUDGET_GAUGES),
                **gc_pause_totals(page),
                **step_split(page),
                **wide_step_choices(page),
                **admitted_by_class(page),
            }
            print(f"{name}: {gauges}", flush=True)
            return replace(figures, server_gauges=gauges, tenant_class=args.tenant_class)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.serve_vs_peer", description=__doc__.splitlines()[0]
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
    p.add_argument(
        "--tenant-class",
        choices=PRIORITIES,
        default="interactive",
        help="priority class of the tenant whose key loads Weir (default: interactive, as the README's tenant)",
    )
    p.add_argument("--tools", type=Path, default=DEFAULT_TOOLS, help="the shared tools folder")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--rounds", type=int, default=1, help="run every system this many times, alternating the order"
    )
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
        ["python", "-m", "weir_bench.experiments.serve_vs_peer", *(sys.argv[1:] if argv is None else argv)]
    )
    variants = {name: (flags, env) for name, flags, env in args.weir}
    rounds: list[list[ServeFigures]] = []
    orders = round_orders([*args.peers, *variants], args.rounds)
    for i, order in enumerate(orders):
        round_args = (
            args
            if args.rounds == 1
            else argparse.Namespace(**{**vars(args), "out": args.out / f"round{i + 1}"})
        )
        round_args.out.mkdir(parents=True, exist_ok=True)
        print(f"round {i + 1} of {args.rounds}: {', '.join(order)}", flush=True)
        rows: list[ServeFigures] = []
        for name in order:
            if name in variants:
                rows.append(run_weir_variant(round_args, name, *variants[name]))
                continue
            try:
                with run_peer(round_args, name) as (url, model, pid):
                    rows.append(run_guidellm(round_args, name, url, model, None, pid))
            except (RuntimeError, subprocess.SubprocessError, OSError, KeyError) as exc:
                print(f"{name}: not measured: {exc}", flush=True)
        canonical = [*args.peers, *variants]
        rows.sort(key=lambda r: canonical.index(r.system))
        rounds.append(rows)
    text = rounds_markdown(rounds, list(variants), command, orders)
    (args.out / "summary.json").write_text(
        json.dumps(
            {
                "command": command,
                "tenant_class": args.tenant_class,
                "rounds": [[asdict(r) for r in rows] for rows in rounds],
            },
            indent=2,
        )
        + "\n"
    )
    (args.out / "summary.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
