"""Whether this machine's one-row products are faster on a transposed copy than on the packed weight.

A batch-1 decode step is a matrix-vector product per linear layer, bound by reading the weight.
Which layout streams faster depends on the CPU and its memory, not on the model: on one 2-core
EPYC host MKL's GEMV over a `[in, out]` copy read at the speed of a plain `sum` while oneDNN's
blocked weight took 1.43-1.49x that; on another of the same kind the blocked weight took 1.25x
and the transposed copy 1.74x (docs/benchmarks.md, "Fourth stop on issues 24 and 27"). A fixed
default is wrong on one of them and the copy doubles the linear weights' memory, so `auto`
measures once per process: a one-row product against a synthetic weight larger than any last
level cache, both layouts alternating, and keeps the copies only where they win by `MARGIN`.

The synthetic weight stands in for the model's (the model's is not loaded yet when the memory
footprint is counted, and the question is about the memory path, not the values).
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# 64 MiB of float32: past the 32 MiB L3 of the hosts measured, so both layouts stream from memory.
PROBE_SHAPE = (16384, 1024)  # [out_features, in_features]
REPS = 5
# The copies cost twice the linear weights' memory: keep them only for a clear win.
MARGIN = 0.9


@dataclass(frozen=True)
class RowWeightTiming:
    """Median seconds of one one-row product over the probe weight, per layout."""

    packed_s: float
    rows_s: float

    @property
    def rows_win(self) -> bool:
        """The transposed copy is worth its memory: at most MARGIN of the packed weight's time."""
        return self.rows_s <= MARGIN * self.packed_s


def _median_alternating(
    first: Callable[[], object], second: Callable[[], object], reps: int
) -> tuple[float, float]:
    """Median seconds of each, timed in alternation (first, second, second, first, ...) after a warm-up."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps):
        order = ((0, first), (1, second)) if rep % 2 == 0 else ((1, second), (0, first))
        for slot, fn in order:
            start = time.perf_counter()
            fn()
            times[slot].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def time_row_products(shape: tuple[int, int] = PROBE_SHAPE, reps: int = REPS) -> RowWeightTiming:
    """Time a one-row product on the packed weight and on a transposed copy (float32, CPU)."""
    out_features, in_features = shape
    with torch.inference_mode():
        weight = torch.rand(out_features, in_features) - 0.5
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        rows = weight.t().contiguous()  # [in_features, out_features]
        del weight
        x = torch.rand(1, in_features)
        packed_s, rows_s = _median_alternating(
            lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
            lambda: x @ rows,
            reps,
        )
    return RowWeightTiming(packed_s=packed_s, rows_s=rows_s)


@functools.cache
def _measured(num_threads: int) -> RowWeightTiming:
    timing = time_row_products()
    logger.info(
        "one-row products on %d thread(s): packed weight %.2f ms, transposed copy %.2f ms: row weights %s",
        num_threads,
        timing.packed_s * 1e3,
        timing.rows_s * 1e3,
        "on" if timing.rows_win else "off",
    )
    return timing


def row_weights_win() -> bool:
    """Whether the transposed copies pay on this machine at the current intra-op thread count
    (measured once per process and thread count, ~0.3 s)."""
    return _measured(torch.get_num_threads()).rows_win
