"""`python -m weir_bench.experiments.small_ops`: each small op of a CPU decode layer, torch's form
against its C kernel, per call, at the row counts a decode step has.

Issue 27, item 1 ("chosen per op with the numbers"). SmolLM2-135M's shapes by default (9 query
heads over 3 KV heads of 64, hidden 576, intermediate 1,536, vocabulary 49,152). For each op and
`--rows` count: the torch form as the model ran it before its kernel, then the C call
(engine/models/native_ops.py), alternating, `--reps` blocks of `--calls` calls each; reported as
median microseconds per call and torch over C. A decode step runs `rope_kv`, `silu_mul` and
`rms_norm` (twice) once a layer (30 layers in SmolLM2), `argmax` or `sample` once.

- `rope_kv`: RoPE on q and k, then the K/V store (`kernels/cpu_rope_kv.py`);
- `silu_mul`: silu(gate) * up (`kernels/cpu_silu_mul.py`);
- `rms_norm`: the residual add and RMSNorm (`kernels/cpu_rms_norm.py`);
- `argmax`: the greedy rows' argmax over the logits (`kernels/cpu_argmax.py`);
- `sample`: the sampled rows' draw at temperature 1 (no top-k, top-p or min-p), `Sampler._sample`
  on its torch path (divide, softmax, cumsum, search, the argmax fallback) against its C path
  (`kernels/cpu_sample.py`), with the same uniform numbers;
- `sample_top_p`: the same at temperature 0.7 and top_p 0.9, top-p's normaliser in torch or in C
  (its `topk` candidates in torch on both).

One intra-op thread (`--threads`), as a decode step's small ops run. Prints and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from weir.engine.models.rope import RotaryEmbedding
from weir.engine.request import SamplingParams
from weir.engine.sampling.sampler import Sampler, SamplingContext
from weir.kernels import cpu_argmax, cpu_rms_norm, cpu_rope_kv, cpu_sample, cpu_silu_mul
from weir.kernels.reference import write_kv
from weir_bench.experiments.alternation import round_orders
from weir_bench.stats import ratio

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE, VOCAB = 9, 3, 64, 576, 1536, 49152
OPS = ("rope_kv", "silu_mul", "rms_norm", "argmax", "sample", "sample_top_p")


def forms(op: str, rows: int) -> dict[str, Callable[[], object]]:
    """`torch` and `c`: one call of each form of `op` on `rows` rows (fresh random inputs)."""
    gen = torch.Generator().manual_seed(rows)
    if op == "rope_kv":
        qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen)
        cos, sin = (
            torch.rand(rows, 1, HEAD_DIM // 2, generator=gen),
            torch.rand(rows, 1, HEAD_DIM // 2, generator=gen),
        )
        cache = torch.zeros(2, 256, 16, KV_HEADS, HEAD_DIM)
        slots = torch.randperm(256 * 16, generator=gen)[:rows]
        qk_width = (HEADS + KV_HEADS) * HEAD_DIM

        def torch_form() -> object:
            qk = RotaryEmbedding.rotate(qkv[:, :qk_width].view(rows, HEADS + KV_HEADS, HEAD_DIM), cos, sin)
            q, k = qk.split([HEADS, KV_HEADS], dim=1)
            v = qkv[:, qk_width:].reshape(rows, KV_HEADS, HEAD_DIM)
            write_kv(k, v.contiguous(), cache, slots)
            return q

        return {
            "torch": torch_form,
            "c": lambda: cpu_rope_kv.rope_kv_write(qkv, cos, sin, slots, cache, HEADS),
        }
    if op == "silu_mul":
        gate_up = torch.randn(rows, 2 * INTERMEDIATE, generator=gen)

        def silu_torch() -> object:
            gate, up = gate_up.split(INTERMEDIATE, dim=-1)
            return F.silu(gate) * up

        return {"torch": silu_torch, "c": lambda: cpu_silu_mul.silu_mul(gate_up)}
    if op == "rms_norm":
        x, residual = torch.randn(rows, HIDDEN, generator=gen), torch.randn(rows, HIDDEN, generator=gen)
        weight = torch.rand(HIDDEN, generator=gen)

        def norm_torch() -> object:
            summed = x + residual
            return F.rms_norm(summed, weight.shape, weight, 1e-5), summed

        return {
            "torch": norm_torch,
            "c": lambda: cpu_rms_norm.add_rms_norm(x, residual.clone(), weight, 1e-5),
        }
    if op == "argmax":
        logits = torch.randn(rows, VOCAB, generator=gen)
        return {"torch": lambda: logits.argmax(dim=-1), "c": lambda: cpu_argmax.argmax_rows(logits)}
    if op in ("sample", "sample_top_p"):
        logits = torch.randn(rows, VOCAB, generator=gen) * 3.0
        params = (
            SamplingParams(temperature=1.0) if op == "sample" else SamplingParams(temperature=0.7, top_p=0.9)
        )
        contexts = [SamplingContext(params, [], [], None) for _ in range(rows)]

        def sample_torch() -> object:  # a sampler seeded alike for both forms: the same numbers
            with _without_c_sampling():
                return Sampler(seed=rows)._sample(logits, contexts)

        return {"torch": sample_torch, "c": lambda: Sampler(seed=rows)._sample(logits, contexts)}
    raise ValueError(f"unknown op {op!r}; choose from {OPS}")


@contextlib.contextmanager
def _without_c_sampling() -> Iterator[None]:
    """The sampler's torch path: the C draw and normaliser reported unavailable meanwhile."""
    saved = cpu_sample.available
    cpu_sample.available = lambda: False  # type: ignore[assignment]
    try:
        yield
    finally:
        cpu_sample.available = saved  # type: ignore[assignment]


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(op: str, rows: int, calls: int, reps: int) -> dict[str, Any]:
    """Median us per call of each form, alternating the order every block, and torch over C."""
    table = forms(op, rows)
    for fn in table.values():  # warm-up (and the first call builds a kernel)
        _per_call(fn, max(1, calls // 10))
    times: dict[str, list[float]] = {name: [] for name in table}
    for order in round_orders(list(table), reps):
        for name in order:
            times[name].append(_per_call(table[name], calls))
    row: dict[str, Any] = {"op": op, "rows": rows}
    for name, values in times.items():
        row[f"{name}_us"] = round(statistics.median(values) * 1e6, 2)
    row["torch_over_c"] = ratio(row["torch_us"], row["c_us"])
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    missing = [
        op
        for op, mod in zip(
            OPS, (cpu_rope_kv, cpu_silu_mul, cpu_rms_norm, cpu_argmax, cpu_sample, cpu_sample), strict=True
        )
        if not mod.available()
    ]
    if missing:
        raise SystemExit(f"C kernels not built (no C compiler?): {missing}")
    results = [measure(op, rows, args.calls, args.reps) for op in args.ops for rows in args.rows]
    return {"threads": args.threads, "calls": args.calls, "reps": args.reps, "results": results}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.small_ops", description=__doc__.splitlines()[0]
    )
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=OPS)
    p.add_argument("--rows", nargs="*", type=int, default=[1, 8])
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    for r in report["results"]:
        print(
            f"{r['op']:>9} rows {r['rows']:>2}: torch {r['torch_us']:8.2f} us, C {r['c_us']:7.2f} us, torch / C {r['torch_over_c']}"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
