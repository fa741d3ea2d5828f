"""`python -m weir_bench.experiments.prefill_attention`: chunked-prefill attention, the oracle's masked SDPA
(`reference.chunk_attention`) against `weir.kernels.prefill_attention.chunk_attention` (prefix and chunk
apart, merged by log-sum-exp), per layer, on the same gathered K/V.

Random fp32 queries and K/V of SmolLM2-135M's attention (9 query heads, 3 KV heads of 64) for a
chunk of `q` new tokens at the end of a context of `n`, for each `q x n` of `--shapes`; both
paths are timed in turn, the order alternating, `--reps` times, and the best of each kept (ms a
layer), with the ratio oracle / split. The maximum difference between the two is reported too.
Only ratios within one run count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from weir.kernels import prefill_attention, reference

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 64
DEFAULT_SHAPES = ("32x100", "64x600", "256x256", "256x512", "256x768")


def _best_ms(call: Callable[[], Any], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return (time.perf_counter() - start) / inner * 1e3


def measure(q_len: int, seq_len: int, reps: int, inner: int) -> dict[str, float]:
    """Best ms a layer of each path, their ratio, and their largest difference."""
    g = torch.Generator().manual_seed(q_len * 7919 + seq_len)
    query = torch.randn(q_len, NUM_HEADS, HEAD_DIM, generator=g)
    key = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=g)
    value = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=g)
    scale = HEAD_DIM**-0.5

    def oracle() -> torch.Tensor:
        return reference.chunk_attention(query, key, value, scale)

    def split() -> torch.Tensor:
        return prefill_attention.chunk_attention(query, key, value, scale)

    calls = {"oracle": oracle, "split": split}
    best = {name: float("inf") for name in calls}
    for name in calls:
        calls[name]()  # warm-up
    for rep in range(reps):
        for name in calls if rep % 2 == 0 else reversed(list(calls)):
            best[name] = min(best[name], _best_ms(calls[name], inner))
    diff = (oracle() - split()).abs().max().item()
    return {
        "oracle_ms": round(best["oracle"], 3),
        "split_ms": round(best["split"], 3),
        "oracle_over_split": round(best["oracle"] / best["split"], 2),
        "max_abs_diff": diff,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.prefill_attention", description=__doc__
    )
    p.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="chunk x context, e.g. 256x768")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--inner", type=int, default=5, help="calls per timed block")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--out", help="also write the JSON report here")
    args = p.parse_args(argv)
    if not prefill_attention.available():
        print("this torch has no CPU flash-attention op: nothing to compare", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for shape in args.shapes:
        q_len, seq_len = (int(x) for x in shape.split("x"))
        if not 1 < q_len <= seq_len:
            p.error(f"shape {shape!r}: need 1 < chunk <= context")
        rows.append({"chunk": q_len, "context": seq_len, **measure(q_len, seq_len, args.reps, args.inner)})
    report = {"torch_threads": torch.get_num_threads(), "rows": rows}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
