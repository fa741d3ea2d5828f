"""`python -m weir_bench.experiments.gemv_layouts`: SmolLM2-135M's 121 linears by weight layout, against a `sum` of the same bytes.

Issue 27, item 2. Random fp32 weights of the model's shapes (30 layers of fused qkv 960x576, o
576x576, fused gate/up 3072x576, down 576x1536, and the 49152x576 LM head: 538 MB, far more than
any cache, so every pass reads them from memory) multiplied by `--rows` input rows in turn, one
pass per variant, the order alternating, `--reps` times; medians of wall time and of the calling
thread's CPU time (`time.thread_time`: with `--threads 1`, the whole of the work):

- `sum`: one `sum` per weight, the read-bandwidth floor;
- `packed`: oneDNN's pre-packed weight (`PackedLinear`, the CPU path before issue 27);
- `f_linear`: `F.linear` on the plain `[out, in]` weight;
- `nk_mv`: `torch.mv` (one row) or `x @ W.t()` on the plain `[out, in]` weight;
- `kn`: `x @ W_t` with `W_t` a contiguous `[in, out]` copy (`PackedLinear`'s row weight where no C compiler builds the kernel);
- `nk_t`, `kn_t`: the same two layouts with the product transposed (`(W @ x.t()).t()`);
- `c_kernel`: the C kernel over the weight packed in column panels (`weir.kernels.cpu_small_gemm`, the
  row copy's product where it builds), for up to its `MAX_ROWS` rows.
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
import torch.nn.functional as F

from weir.engine.models.packed_linear import PackedLinear
from weir.kernels import cpu_small_gemm
from weir_bench.stats import ratio

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def variants(rows: int) -> tuple[dict[str, Callable[[], object]], int]:
    """Name -> one pass over every weight; and the bytes of the weights."""
    gen = torch.Generator().manual_seed(0)
    plain = [torch.randn(n, k, generator=gen) * 0.02 for n, k in SHAPES]
    transposed = [w.t().contiguous() for w in plain]
    packed = [PackedLinear(w, None) for w in plain]
    xs = {k: torch.randn(rows, k, generator=gen) for k in {k for _, k in SHAPES}}
    ins = [xs[k] for _, k in SHAPES]

    def each(fn: Callable[[int], object]) -> Callable[[], object]:
        return lambda: [fn(i) for i in range(len(SHAPES))]

    table: dict[str, Callable[[], object]] = {
        "sum": each(lambda i: plain[i].sum()),
        "packed": each(lambda i: packed[i](ins[i])),
        "f_linear": each(lambda i: F.linear(ins[i], plain[i])),
        "nk_mv": each(
            lambda i: torch.mv(plain[i], ins[i][0]) if rows == 1 else torch.mm(ins[i], plain[i].t())
        ),
        "kn": each(lambda i: torch.mm(ins[i], transposed[i])),
        "nk_t": each(lambda i: torch.mm(plain[i], ins[i].t()).t()),
        "kn_t": each(lambda i: torch.mm(transposed[i].t(), ins[i].t()).t()),
    }
    if cpu_small_gemm.available() and rows <= cpu_small_gemm.MAX_ROWS:
        gemms = [cpu_small_gemm.SmallGemm(w) for w in plain]
        table["c_kernel"] = each(lambda i: gemms[i](ins[i]))
    return table, sum(w.numel() * w.element_size() for w in plain)


def run(rows: int, reps: int) -> dict[str, Any]:
    table, num_bytes = variants(rows)
    names = list(table)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with torch.inference_mode():
        for fn in table.values():  # warm-up
            fn()
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                wall, cpu = time.perf_counter(), time.thread_time()
                table[name]()
                times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    result: dict[str, Any] = {
        "rows": rows,
        "threads": torch.get_num_threads(),
        "weight_bytes": num_bytes,
        "reps": reps,
        "load_average": os.getloadavg(),
    }
    base_wall = statistics.median(t[0] for t in times["sum"])
    base_cpu = statistics.median(t[1] for t in times["sum"])
    for name in names:
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        result[name] = {
            "wall_ms": round(wall * 1e3, 2),
            "cpu_ms": round(cpu * 1e3, 2),
            "gb_per_s_wall": round(num_bytes / wall / 1e9, 1),
            "over_sum_wall": ratio(wall, base_wall),
            "over_sum_cpu": ratio(cpu, base_cpu),
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.gemv_layouts", description=__doc__.splitlines()[0]
    )
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps([run(rows, args.reps) for rows in args.rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
