"""`python -m weir_bench.experiments.cpu_decode_attention`: the C decode attention over every layer of a
step, against a `sum` of the K/V bytes it must read.

Issue 27. SmolLM2-135M's attention shapes by default (30 layers, 9 query heads over 3 KV heads of
64, blocks of 16 tokens): `--batch` sequences of `--context-len` tokens each, their blocks
scattered over each layer's cache in a random order (as a long-running pool leaves them), one
call of `weir.kernels.cpu_decode_attention.decode_attention` per layer. Reported: medians of wall and
calling-thread CPU time of the whole step's attention against one `sum` over the same K/V blocks,
the order alternating, `--reps` times. The `sum` is the memory-read floor; the kernel's
multiply-adds come on top.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from weir.kernels import cpu_decode_attention


def workload(
    batch: int, context_len: int, layers: int, heads: tuple[int, int], head_dim: int, block_size: int
) -> tuple[dict[str, Callable[[], object]], int]:
    """Name -> one step's pass (`kernel`: the attention of every layer; `sum`: the read of the
    same K/V blocks); and the bytes of those blocks."""
    gen = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads = heads
    per_seq = (context_len + block_size - 1) // block_size
    num_blocks = 2 * batch * per_seq + 8  # half the pool unused, as in a pool with free blocks
    caches = [
        torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen) for _ in range(layers)
    ]
    tables = torch.randperm(num_blocks, generator=gen)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    plan = cpu_decode_attention.plan(tables, [context_len] * batch, block_size)
    query = torch.randn(batch, num_heads, head_dim, generator=gen)
    ids = tables.flatten().long()
    read = [cache[:, ids] for cache in caches]  # the same blocks, contiguous, for the sum
    scale = head_dim**-0.5

    def kernel() -> object:
        return [cpu_decode_attention.decode_attention(query, cache, plan, scale) for cache in caches]

    def read_all() -> object:
        return [blocks.sum() for blocks in read]

    return {"sum": read_all, "kernel": kernel}, sum(b.numel() * b.element_size() for b in read)


def run(args: argparse.Namespace) -> dict[str, Any]:
    table, num_bytes = workload(
        args.batch, args.context_len, args.layers, (args.heads, args.kv_heads), args.head_dim, args.block_size
    )
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
    with torch.inference_mode():
        for fn in table.values():  # warm-up (and the first call builds the kernel)
            fn()
        for rep in range(args.reps):
            for name in table if rep % 2 == 0 else reversed(list(table)):
                wall, cpu = time.perf_counter(), time.thread_time()
                table[name]()
                times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    result: dict[str, Any] = {
        "batch": args.batch,
        "context_len": args.context_len,
        "layers": args.layers,
        "threads": torch.get_num_threads(),
        "kv_bytes": num_bytes,
        "reps": args.reps,
        "load_average": os.getloadavg(),
    }
    for name in table:
        result[f"{name}_wall_ms"] = round(statistics.median(t[0] for t in times[name]) * 1e3, 2)
        result[f"{name}_wall_min_ms"] = round(min(t[0] for t in times[name]) * 1e3, 2)
        result[f"{name}_cpu_ms"] = round(statistics.median(t[1] for t in times[name]) * 1e3, 2)
    result["kernel_over_sum_wall"] = round(result["kernel_wall_ms"] / result["sum_wall_ms"], 2)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.cpu_decode_attention", description=__doc__.splitlines()[0]
    )
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context-len", type=int, nargs="+", default=[160, 512])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = p.parse_args(argv)
    if not cpu_decode_attention.available():
        p.error("the C decode attention cannot be built here (no C compiler?)")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for context_len in args.context_len:
        args_one = argparse.Namespace(**{**vars(args), "context_len": context_len})
        rows.append(run(args_one))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
