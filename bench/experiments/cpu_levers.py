"""`python -m weir_bench.experiments.cpu_levers --model DIR`: CPU decode levers A/B, in one run.

Each lever is a variant of one packed CPU engine (engine/models/packed_linear.py), switched on
and off in the same process, so all variants share the machine's state:

- `unfused`: decode attention through `weir.kernels.reference.paged_attention` (per layer: the block
  index, two gathers, the mask, one scatter per row), 2 intra-op threads;
- `fused`: `weir.kernels.decode_attention` (plan once per step, one gather per layer and group of
  similar context lengths, grouped queries without repeating K/V), 2 threads;
- `unfused_1thread`, `fused_1thread`: the same with `torch.set_num_threads(1)`: the engine
  thread alone on one core, leaving the other to the event loop, tokenizers and other processes;
- `weight_read`: one read of every weight (a `sum` per tensor, over a plain copy of the model as
  in `cpu_fast_path`), the floor of a decode step.

Each repetition times `--steps` decode steps of every variant in an order that alternates
(forwards, then backwards), `--reps` times; medians and minima are reported, with ratios to
`unfused` and to the weight read. On a shared machine only the ratios within one run count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from weir.engine.llm_engine import LLMEngine
from weir.engine.models.attention import TorchAttentionBackend
from weir_bench.experiments.cpu_fast_path import (
    WeightReader,
    _start_decoding,
    _time_call,
    _time_steps,
    build_cpu_engine,
    plain_weight_reader,
)


def torch_backend(engine: LLMEngine) -> TorchAttentionBackend:
    """The one attention backend every layer of the engine's model shares."""
    backends = {
        id(m.attn_backend): m.attn_backend
        for m in engine.runner.model.modules()
        if hasattr(m, "attn_backend")
    }
    if len(backends) != 1:
        raise RuntimeError(f"expected one shared attention backend, found {len(backends)}")
    (backend,) = backends.values()
    if not isinstance(backend, TorchAttentionBackend):
        raise RuntimeError(f"expected the torch backend, got {type(backend).__name__}")
    return backend


def variants(engine: LLMEngine, threads: int) -> dict[str, Callable[[], None]]:
    """Name -> a call that switches the engine to that variant."""
    backend = torch_backend(engine)

    def use(fused: bool, num_threads: int) -> Callable[[], None]:
        def switch() -> None:
            backend.fused_decode = fused
            torch.set_num_threads(num_threads)

        return switch

    return {
        "unfused": use(False, threads),
        "fused": use(True, threads),
        "unfused_1thread": use(False, 1),
        "fused_1thread": use(True, 1),
    }


def measure(
    engine: LLMEngine,
    read_weights: WeightReader,
    batch: int,
    context_len: int,
    steps: int,
    reps: int,
    threads: int,
) -> dict[str, Any]:
    """Median and min ms per decode step of every variant at one batch size, and of a weight read."""
    switches = variants(engine, threads)
    ids = _start_decoding(engine, batch, context_len, 2 * reps * steps * len(switches) + 8)
    names = [*switches, "weight_read"]
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up: one block of each
        if name in switches:
            switches[name]()
            _time_steps(engine, 1)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            if name == "weight_read":
                torch.set_num_threads(threads)
                times[name].append(_time_call(read_weights))
            else:
                switches[name]()
                times[name].append(_time_steps(engine, steps))
    for rid in ids:
        engine.abort(rid)
    row: dict[str, Any] = {"batch": batch, "context_len": context_len, "steps": steps, "reps": reps}
    for name in names:
        row[f"{name}_ms"] = round(statistics.median(times[name]) * 1e3, 2)
        row[f"{name}_min_ms"] = round(min(times[name]) * 1e3, 2)
    for name in switches:
        row[f"unfused_over_{name}"] = round(row["unfused_ms"] / row[f"{name}_ms"], 3)
        row[f"{name}_over_weight_read"] = round(row[f"{name}_ms"] / row["weight_read_ms"], 2)
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    max_len = args.context_len + 6 * args.reps * args.steps + 64
    engine = build_cpu_engine(args.model, args.dtype, True, max(args.batches), max_len)
    read_weights = plain_weight_reader(args.model, args.dtype)  # the packed engine's are not parameters
    threads = args.threads or torch.get_num_threads()
    rows = [
        measure(engine, read_weights, b, args.context_len, args.steps, args.reps, threads)
        for b in args.batches
    ]
    first = rows[0]
    for row in rows:
        for name in ("unfused", "fused", "unfused_1thread", "fused_1thread"):
            row[f"{name}_over_batch{first['batch']}"] = round(row[f"{name}_ms"] / first[f"{name}_ms"], 2)
    torch.set_num_threads(threads)
    return {
        "model": str(args.model),
        "dtype": args.dtype,
        "threads": threads,
        "weight_bytes": read_weights.num_bytes,
        "decode": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.cpu_levers", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True, help="a prepared model folder")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--context-len", type=int, default=128, help="prompt tokens of each decoding sequence")
    p.add_argument("--steps", type=int, default=4, help="decode steps per timed block")
    p.add_argument("--reps", type=int, default=8, help="timed blocks per variant and batch size")
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads of the 2-thread variants (0: torch's)"
    )
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
