"""`python -m weir_bench.experiments.gil_contention --model DIR`: decode steps beside a thread busy in Python, by GIL switch interval.

Issue 27, item 3. In `weir serve` the engine thread and the HTTP event loop share one GIL. Every
torch op of a step (~600 for a 30-layer model) releases the GIL and takes it back; when the
loop's thread is running Python at that moment (SSE chunks, request parsing, admission), the
engine thread waits until CPython asks the loop's thread to drop the GIL, which it does after
the switch interval (`sys.setswitchinterval`, 5 ms by default). A busy front end then
stretches every step, i.e. every stream's inter-token latency.

This experiment isolates that effect in one process, without HTTP: one engine (fp32, the CPU
fast path) decodes `--batch` sequences on the main thread while a second thread stands in for
the event loop, busy in pure Python a `--duties` fraction of the time (short bursts, then a
sleep of `PERIOD_S`). For each switch interval in `--intervals-ms`: the median step time with
the busy thread and without it (duty 0), alternated `--reps` times, and how much Python work
the busy thread got done per second (so a shorter interval is not bought by starving the loop).
Reported: each step time over the step time alone at the same interval. Only ratios within one
run count; the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.gateway.server.uvicorn_runner import gil_switch_interval
from weir_bench.experiments.cpu_fast_path import _start_decoding, cpu_engine_config

PERIOD_S = 0.002  # the busy thread's sleep between bursts (an event loop woken often)


class BusyThread:
    """A thread in pure Python `duty` of the time: bursts of `duty / (1 - duty) * PERIOD_S`, each
    followed by a `PERIOD_S` sleep. Counts the work units it finished (one `sum(range(200))`)."""

    def __init__(self, duty: float) -> None:
        if not 0 < duty < 1:
            raise ValueError(f"duty must be in (0, 1), got {duty}")
        self.burst_s = duty / (1 - duty) * PERIOD_S
        self.units = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="busy-python")

    def _run(self) -> None:
        while not self._stop.is_set():
            end = time.perf_counter() + self.burst_s
            while time.perf_counter() < end:
                sum(range(200))
                self.units += 1
            time.sleep(PERIOD_S)

    def __enter__(self) -> BusyThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _block(engine: LLMEngine, steps: int, duty: float) -> tuple[float, float]:
    """(seconds per step, busy work units per second) of `steps` steps at `duty` (0: alone)."""
    busy = BusyThread(duty) if duty > 0 else None
    with busy or contextlib.nullcontext():
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        elapsed = time.perf_counter() - t0
    return elapsed / steps, (busy.units / elapsed if busy is not None else 0.0)


def measure(
    engine: LLMEngine, intervals_s: Sequence[float], duties: Sequence[float], steps: int, reps: int
) -> list[dict[str, Any]]:
    """One row per (interval, duty): median step ms, over the same interval's alone, busy units/s.
    Each block runs under `weir serve`'s own `gil_switch_interval`, which restores the previous."""
    cells = [(i, d) for i in intervals_s for d in (0.0, *duties)]
    times: dict[tuple[float, float], list[tuple[float, float]]] = {c: [] for c in cells}
    for rep in range(reps):
        for interval, duty in cells if rep % 2 == 0 else reversed(cells):
            with gil_switch_interval(interval):
                times[(interval, duty)].append(_block(engine, steps, duty))
    rows = []
    for interval, duty in cells:
        step_s = statistics.median(t for t, _ in times[(interval, duty)])
        alone_s = statistics.median(t for t, _ in times[(interval, 0.0)])
        rows.append(
            {
                "switch_interval_ms": round(interval * 1e3, 3),
                "duty": duty,
                "step_ms": round(step_s * 1e3, 2),
                "over_alone": round(step_s / alone_s, 3),
                "busy_units_per_s": round(statistics.median(u for _, u in times[(interval, duty)])),
            }
        )
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table of `measure`'s rows."""
    lines = [
        "| switch interval ms | busy thread duty | step ms | over alone | busy work units/s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['switch_interval_ms']} | {r['duty']} | {r['step_ms']} | {r['over_alone']} | "
            f"{r['busy_units_per_s']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.gil_contention", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True, help="a prepared model folder")
    p.add_argument("--batch", type=int, default=8, help="decoding sequences")
    p.add_argument("--context-len", type=int, default=128, help="prompt tokens of each sequence")
    p.add_argument("--duties", type=float, nargs="+", default=[0.3, 0.6])
    p.add_argument("--intervals-ms", type=float, nargs="+", default=[5.0, 1.0, 0.5, 0.2])
    p.add_argument("--steps", type=int, default=6, help="decode steps per timed block")
    p.add_argument("--reps", type=int, default=4, help="timed blocks per cell")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cells = len(args.intervals_ms) * (1 + len(args.duties))
    max_len = args.context_len + args.steps * args.reps * cells + 16
    config = cpu_engine_config(args.model, "float32", True, args.batch, max_len)
    engine = build_engine(dataclasses.replace(config, cpu_row_weights=True))
    _start_decoding(engine, args.batch, args.context_len, max_len - args.context_len - 4)
    rows = measure(engine, [ms / 1e3 for ms in args.intervals_ms], args.duties, args.steps, args.reps)
    report = {"model": str(args.model), "batch": args.batch, "threads": torch.get_num_threads(), "rows": rows}
    print(markdown(rows))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
