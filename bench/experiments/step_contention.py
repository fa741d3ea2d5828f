"""`python -m weir_bench.experiments.step_contention --model DIR`: the decode step while another process takes CPU.

In `weir serve` on a small CPU host the engine's intra-op threads share the cores with the HTTP
event loop, the tokenizer workers and, in a benchmark, the load generator. A thread of the step
that loses its core for a few milliseconds holds up every part of the step split over the
threads. This steps one engine (as `weir serve` builds it for float32 CPU: packed linears, row
weights auto, the C small ops) at `--batch` decode rows on `--threads` intra-op threads, in
blocks of `--steps` steps that alternate between quiet and each `--burn BUSY/IDLE` load: a
separate process that spins BUSY ms then sleeps IDLE ms (BUSY / (BUSY + IDLE) of one core, in
bursts, as a front end's work arrives). Each block starts the load fresh and stops it after.

Each `--modes` runs every load in turn, alternated within each round: `omp` steps with torch on
`--threads` intra-op threads and the C kernels on OpenMP teams of as many; `pool` steps with torch
on one thread and the C kernels on `--threads` threads of their work pool
(kernels/cpu_work_pool.py), as `weir serve`'s decode steps run (engine/runner/step_threads.py).

Reported per mode and load: the median, p90 and max step time over `--rounds` rounds. The context
grows over the run (one token a step), the same for every cell, since the blocks alternate.
Other code is compared by running this from two checkouts in turn (only ratios within one run, or
alternated runs, count on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from weir.kernels import cpu_work_pool
from weir_bench.experiments.cpu_fast_path import _start_decoding
from weir_bench.experiments.decode_roofline import build_variant

_BURNER = """
import sys, time
busy, idle, end = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    time.sleep(idle)
"""
QUIET = "quiet"
MODES = ("omp", "pool")


def parse_burn(text: str) -> tuple[float, float]:
    """`BUSY/IDLE` in ms (BUSY > 0, IDLE >= 0)."""
    try:
        busy, idle = (float(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BUSY/IDLE in ms, got {text!r}") from None
    if not busy > 0 or idle < 0:
        raise argparse.ArgumentTypeError(f"BUSY must be > 0 and IDLE >= 0, got {text!r}")
    return busy, idle


def _burner(busy_ms: float, idle_ms: float, bound_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _BURNER, str(busy_ms), str(idle_ms), str(bound_s)])


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 2),
        "max_ms": round(ordered[-1], 2),
        "steps": len(ordered),
    }


def _set_mode(mode: str, threads: int) -> None:
    if mode == "omp":
        torch.set_num_threads(threads)
        cpu_work_pool.set_pool_threads(0)
    else:
        torch.set_num_threads(1)
        cpu_work_pool.set_pool_threads(threads)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds, modes = args.rounds, args.modes
    max_tokens = args.max_model_len - args.context_len
    if rounds * len(modes) * (1 + len(args.burn)) * args.steps + args.warmup >= max_tokens:
        raise SystemExit("--rounds x modes x loads x --steps must fit in --max-model-len less --context-len")
    torch.set_num_threads(args.threads)
    engine = build_variant("rows_auto", args.model, args.batch, args.max_model_len)
    _start_decoding(engine, args.batch, args.context_len, max_tokens)
    loads: list[tuple[str, tuple[float, float] | None]] = [(QUIET, None)]
    loads += [(f"{busy:g}/{idle:g}", (busy, idle)) for busy, idle in args.burn]
    times: dict[str, dict[str, list[float]]] = {m: {name: [] for name, _ in loads} for m in modes}
    try:
        for mode in modes:
            _set_mode(mode, args.threads)
            for _ in range(args.warmup):
                engine.step()
        for _ in range(rounds):
            for mode in modes:
                _set_mode(mode, args.threads)
                for name, burn in loads:
                    proc = None if burn is None else _burner(*burn, bound_s=120.0)
                    if proc is not None:
                        time.sleep(0.3)  # the interpreter is up and spinning
                    try:
                        for _ in range(args.steps):
                            t0 = time.perf_counter()
                            engine.step()
                            times[mode][name].append((time.perf_counter() - t0) * 1e3)
                    finally:
                        if proc is not None:
                            proc.kill()
                            proc.wait()
    finally:
        cpu_work_pool.set_pool_threads(0)
    return {
        "config": {
            "batch": args.batch,
            "threads": args.threads,
            "context_len": args.context_len,
            "steps": args.steps,
            "rounds": rounds,
            "pool_available": cpu_work_pool.available(),
        },
        "steps": {m: {name: summarize(ts) for name, ts in by_load.items()} for m, by_load in times.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context-len", type=int, default=150)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=12, help="steps per block")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--burn", type=parse_burn, nargs="*", default=[(3.0, 12.0)], help="BUSY/IDLE ms")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here as well")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
