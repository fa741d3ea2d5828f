"""`python -m weir_bench.experiments.decode_roofline --model DIR`: CPU decode-step variants against one read of every weight.

Issue 27, items 1 and 2. Each variant is its own engine (SmolLM2-class model, fp32, packed CPU
linears), all built in one process and stepped in an order that alternates (forwards, then
backwards) with one read of every weight (a `sum` per tensor of a plain copy of the model: the
floor of a batch-1 decode step), `--reps` times, `--steps` decode steps per timed block:

- `packed`: the packed oneDNN linears at every row count (the path before issue 27);
- `rows`: + a copy of every linear weight for one-row inputs (`EngineConfig.cpu_row_weights` on:
  the C kernel's panels, or a transposed weight without a C compiler; engine/models/packed_linear.py);
- `rows_auto`: + the copies with `cpu_row_weights` auto, as `weir serve` runs by default: the
  start-up probe (engine/models/row_weight_probe.py) decides up to how many rows they serve
  (with the C kernel's panels, 8 on the hosts measured), so batch 8 takes them as well;
- `rows_unfused`: `rows` with the per-layer small ops as they were before issue 27 (RMSNorm in
  six ops, RoPE tables gathered and q and k rotated apart in every layer; `LlamaForCausalLM.fused_ops`
  off), to price the hand-fused ops alone: the same engine as `rows` when both run (the switch is
  flipped before each block), so that the two differ in that switch only;
- `torch_attention`: `packed` with the decode attention in torch (a gather of each row's blocks
  and SDPA per layer, `TorchAttentionBackend.native_decode` off) instead of the C kernel that reads
  the paged cache in place: the same engine as `packed` when both run, the switch flipped before
  each block;
- `torch_norms`: `packed` with each residual add and RMSNorm in torch (`LlamaForCausalLM.native_ops`
  `norms` off) instead of one C call: the same engine as `packed` when both run, the switch flipped;
- `torch_rope_kv`, `torch_silu_mul`: `rows_auto` with RoPE + the K/V store, or SiLU-and-mul, in
  torch instead of one C call (`LlamaForCausalLM.native_ops`, engine/models/native_ops.py): the
  same engine as `rows_auto` when both run, the switch flipped;
- `layer_by_layer`: `rows_auto` with each layer's C kernels called one by one from Python instead
  of a decode step's layers in one C call (`native_ops.decode_layers` off;
  engine/models/native_decode.py): the same engine as `rows_auto` when both run, the switch flipped;
- `compiled` (not run by default): plain weights, `torch.compile` (inductor's C++ backend, fixed
  shapes) over the model's forward with the attention backend left out of the graph
  (`torch.compiler.disable`: the paged metadata is Python); inductor fuses the small ops between
  the linears and calls MKL for the GEMMs. The first step of each batch size compiles (tens of
  seconds); the engine has no such path (docs/decisions.md).

`--wide-step-threads N` steps each engine as `weir serve` does (engine/runner/step_threads.py): steps
of `--wide-step-rows` rows or more on N intra-op threads or on `--threads`, whichever its own
measurements find faster (the warm-up covers its first measurements; one timed step in 16 runs
on the other count); the others on `--threads`; the weight read always runs on `--threads`.

Two clocks per block: wall time, and the CPU time of the stepping thread (`time.thread_time`),
which with one intra-op thread (`--threads 1`, the default here) is all of the step's compute and
is far less disturbed by other processes on a shared machine than the wall clock. Reported:
medians and minima, each variant over the weight read, each over `packed`, and batch B over
batch 1. Only ratios within one run count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from weir.engine.config import WIDE_STEP_ROWS
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir_bench.experiments.cpu_fast_path import _start_decoding, cpu_engine_config, plain_weight_reader
from weir_bench.stats import ratio

VARIANTS = (
    "packed",
    "rows",
    "rows_auto",
    "rows_unfused",
    "torch_attention",
    "torch_norms",
    "torch_rope_kv",
    "torch_silu_mul",
    "layer_by_layer",
)
# variant -> the variant whose engine it steps with a switch flipped (see the module docstring)
SWITCHED = {
    "rows_unfused": "rows",
    "torch_attention": "packed",
    "torch_norms": "packed",
    "torch_rope_kv": "rows_auto",
    "torch_silu_mul": "rows_auto",
    "layer_by_layer": "rows_auto",
}
OPTIONAL_VARIANTS = ("compiled",)


class _CompiledForward(torch.nn.Module):
    """The runner's model with its forward compiled (the `compiled` variant)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        for module in model.modules():  # one backend shared by every layer
            if hasattr(module, "attn_backend"):
                backend = module.attn_backend
                backend.forward = torch.compiler.disable(backend.forward)
        self.compiled = torch.compile(model.forward, dynamic=False)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.compiled(*args, **kwargs)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)  # type: ignore[operator, no-any-return]


def build_variant(
    name: str,
    model: Path,
    max_num_seqs: int,
    max_model_len: int,
    wide_step_threads: int | None = None,
    wide_step_rows: int = WIDE_STEP_ROWS,
) -> LLMEngine:
    """The engine of one variant (see the module docstring), switching wide steps to
    `wide_step_threads` (None: no switch)."""
    if name == "compiled":
        engine = build_engine(cpu_engine_config(model, "float32", False, max_num_seqs, max_model_len))
        engine.runner.model = _CompiledForward(engine.runner.model)
        return engine
    base = cpu_engine_config(model, "float32", True, max_num_seqs, max_model_len)
    return build_engine(
        dataclasses.replace(
            base,
            cpu_row_weights=None if name == "rows_auto" else name in ("rows", "rows_unfused"),
            cpu_wide_step_threads=wide_step_threads,
            cpu_wide_step_rows=wide_step_rows,
        )
    )


def _on_threads(count: int, call: Callable[[], None]) -> Callable[[], None]:
    """`call` on `count` intra-op threads, the count it found restored after."""

    def run() -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            call()
        finally:
            torch.set_num_threads(before)

    return run


def _set_switches(engine: LLMEngine, name: str) -> None:
    """The per-variant switches of an engine shared by two variants."""
    model = engine.runner.model
    if not hasattr(model, "layers"):
        return  # `compiled`: no switches
    model.fused_ops = name != "rows_unfused"
    built = model.native_ops_built
    model.native_ops.norms = name != "torch_norms" and built.norms
    model.native_ops.rope_kv = name != "torch_rope_kv" and built.rope_kv
    model.native_ops.silu_mul = name != "torch_silu_mul" and built.silu_mul
    model.native_ops.decode_layers = name != "layer_by_layer" and built.decode_layers
    for layer in model.layers:
        layer.self_attn.attn_backend.native_decode = name != "torch_attention"


def _block(step: Callable[[], Any], count: int) -> tuple[float, float]:
    """(wall, thread CPU) seconds per call of `count` calls."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(count):
        step()
    return (time.perf_counter() - wall) / count, (time.thread_time() - cpu) / count


def measure(
    engines: dict[str, LLMEngine],
    read_weights: Callable[[], None],
    batch: int,
    context_len: int,
    steps: int,
    reps: int,
) -> dict[str, Any]:
    """Median and min ms (wall and CPU) of a decode step of every variant and of the weight read."""
    distinct = {id(eng): eng for eng in engines.values()}
    ids = {
        key: _start_decoding(eng, batch, context_len, 4 * reps * steps + 8) for key, eng in distinct.items()
    }

    def stepper(name: str) -> Callable[[], Any]:
        engine = engines[name]

        def step() -> Any:
            _set_switches(engine, name)
            return engine.step()

        return step

    names = [*engines, "weight_read"]
    for name in engines:  # warm-up: one step of each, or as many as the wide-step choice measures first
        threads = engines[name].runner.threads
        _block(stepper(name), threads.window if threads is not None else 1)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            if name == "weight_read":
                times[name].append(_block(read_weights, 1))
            else:
                times[name].append(_block(stepper(name), steps))
    for key, eng in distinct.items():
        for rid in ids[key]:
            eng.abort(rid)
    row: dict[str, Any] = {"batch": batch, "context_len": context_len, "steps": steps, "reps": reps}
    for name in names:
        for i, clock in enumerate(("wall", "cpu")):
            values = [t[i] for t in times[name]]
            row[f"{name}_{clock}_ms"] = round(statistics.median(values) * 1e3, 2)
            row[f"{name}_{clock}_min_ms"] = round(min(values) * 1e3, 2)
    for name in engines:
        for clock in ("wall", "cpu"):
            row[f"{name}_over_weight_read_{clock}"] = ratio(
                row[f"{name}_{clock}_ms"], row[f"weight_read_{clock}_ms"]
            )
            if "packed" in engines:
                row[f"packed_over_{name}_{clock}"] = ratio(
                    row[f"packed_{clock}_ms"], row[f"{name}_{clock}_ms"]
                )
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    max_len = args.context_len + 4 * args.reps * args.steps + 64
    engines: dict[str, LLMEngine] = {}
    for name in args.variants:
        if SWITCHED.get(name) in args.variants:
            continue  # stepped on its base variant's engine with a switch flipped
        engines[name] = build_variant(
            name, args.model, max(args.batches), max_len, args.wide_step_threads, args.wide_step_rows
        )
    for name, base in SWITCHED.items():
        if name in args.variants and base in args.variants:
            engines[name] = engines[base]
    reader = plain_weight_reader(args.model, "float32")
    read = _on_threads(args.threads or torch.get_num_threads(), reader)
    rows = [measure(engines, read, b, args.context_len, args.steps, args.reps) for b in args.batches]
    first = rows[0]
    for row in rows:
        for name in engines:
            for clock in ("wall", "cpu"):
                row[f"{name}_over_batch{first['batch']}_{clock}"] = ratio(
                    row[f"{name}_{clock}_ms"], first[f"{name}_{clock}_ms"]
                )
    return {
        "model": str(args.model),
        "threads": args.threads or torch.get_num_threads(),
        "wide_step_threads": args.wide_step_threads,
        "wide_step_rows": args.wide_step_rows,
        "weight_bytes": reader.num_bytes,
        "load_average": os.getloadavg(),
        "decode": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.decode_roofline", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True, help="a prepared model folder")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + OPTIONAL_VARIANTS)
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--context-len", type=int, default=128, help="prompt tokens of each decoding sequence")
    p.add_argument("--steps", type=int, default=8, help="decode steps per timed block")
    p.add_argument("--reps", type=int, default=8, help="timed blocks per variant and batch size")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument(
        "--wide-step-threads",
        type=int,
        help="intra-op threads for wide steps, as served (default: no switch)",
    )
    p.add_argument(
        "--wide-step-rows", type=int, default=WIDE_STEP_ROWS, help="rows from which a step is wide"
    )
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
