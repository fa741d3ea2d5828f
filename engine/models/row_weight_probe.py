"""Whether this machine's few-row products are faster on a second copy of each weight than on
the packed one, and up to how many rows.

A decode step of a small batch is a matrix-vector product per linear layer, bound by reading
the weight. Which layout streams faster depends on the CPU and its memory, not on the model: on
one 2-core EPYC host MKL's GEMV over a `[in, out]` copy read at the speed of a plain `sum` while
oneDNN's blocked weight took 1.43-1.49x that; on another of the same kind the blocked weight took
1.25x and the transposed copy 1.74x; the C kernel took 0.88-0.93x the `sum` at one row over the
plain row-major weight but lost to oneDNN from about four rows, and over its weight packed in
column panels (its layout now) it beat oneDNN at 1, 2, 4 and 8 rows on the host measured
(docs/benchmarks.md). A fixed default is wrong on some host and the copy doubles the linear
weights' memory, so `auto` measures once per process and model shape: products of 1, 2, 4, 8 and
16 rows (the C kernel's reach: 8 in registers, 16 as two groups over each panel) against
synthetic weights of the model's layer shapes, repeated to 256 MiB (far past any last level
cache), both layouts alternating. The copies are kept where one row wins by `MARGIN`;
they then serve every row count up to the last that still wins. The shapes matter beside the memory
path: a small model's ~120 products a step pay oneDNN's fixed cost per call (~18 us, the C
kernel's ~5 us) as much as the read.

The synthetic weights stand in for the model's (the model's are not loaded yet when the memory
footprint is counted, and the question is about the memory path, not the values).
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from weir.engine.models.packed_linear import row_copy_native
from weir.kernels import cpu_small_gemm

logger = logging.getLogger(__name__)

# 256 MiB of float32 weights in all (~0.3 s a row count): well past the 32 MiB L3 of the hosts
# measured. At 64 MiB the layouts still ranked differently than over a whole model's 0.5 GB
# (docs/benchmarks.md, fifth stop); both copies are freed before the model loads.
PROBE_BYTES = 256 << 20
# A tiny model's layers would take tens of thousands of weights to fill PROBE_BYTES (25 s of
# calls, measured on a test model): at most this many (SmolLM2 fills PROBE_BYTES with 76).
MAX_WEIGHTS = 128
DEFAULT_SHAPES = ((16384, 1024),)  # [out_features, in_features]
REPS = 5
ROW_COUNTS = (1, 2, 4, 8, 16)
# The copies cost twice the linear weights' memory: keep them only for a clear win.
MARGIN = 0.9


@dataclass(frozen=True)
class RowWeightTiming:
    """Median seconds of one product over the probe weight, per layout, for each row count timed
    (the copy's layout: the C kernel's panels, else MKL's transposed weight for one row)."""

    rows: tuple[int, ...]  # the row counts timed, ascending, starting at 1
    packed_s: tuple[float, ...]
    rows_s: tuple[float, ...]

    @property
    def rows_win(self) -> bool:
        """The copy is worth its memory: at most MARGIN of the packed weight's time at one row."""
        return self.rows_s[0] <= MARGIN * self.packed_s[0]

    @property
    def row_inputs(self) -> int:
        """Inputs of up to this many rows take the copy (0: no copy): the last row count timed
        up to which the copy is never slower, once it wins at one row."""
        if not self.rows_win:
            return 0
        limit = 0
        for rows, packed_s, rows_s in zip(self.rows, self.packed_s, self.rows_s, strict=True):
            if rows_s > packed_s:
                break
            limit = rows
        return limit


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


def probe_shapes(
    layer_shapes: Sequence[tuple[int, int]], total_bytes: int = PROBE_BYTES, max_weights: int = MAX_WEIGHTS
) -> list[tuple[int, int]]:
    """The layer's float32 `[out, in]` shapes repeated until they hold `total_bytes` or number
    `max_weights` (a shape larger than `total_bytes` alone is cut to that many bytes' worth of
    output rows)."""
    if not layer_shapes or any(out < 1 or inp < 1 for out, inp in layer_shapes):
        raise ValueError(f"shapes must be non-empty and positive, got {list(layer_shapes)}")
    shapes: list[tuple[int, int]] = []
    held = 0
    while held < total_bytes and len(shapes) < max_weights:
        for out, inp in layer_shapes:
            out = max(1, min(out, total_bytes // (4 * inp)))
            shapes.append((out, inp))
            held += 4 * out * inp
            if held >= total_bytes or len(shapes) >= max_weights:
                break
    return shapes


def time_row_products(
    layer_shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
    total_bytes: int = PROBE_BYTES,
    reps: int = REPS,
    row_counts: tuple[int, ...] = ROW_COUNTS,
) -> RowWeightTiming:
    """Time products of each row count over every weight of `probe_shapes` on the packed weights
    and on the copies (float32, CPU): the C kernel's panels where it builds, else
    transposed copies at one row only."""
    native = row_copy_native()
    counts = row_counts if native else row_counts[:1]
    packed_times: list[float] = []
    rows_times: list[float] = []
    with torch.inference_mode():
        shapes = probe_shapes(layer_shapes, total_bytes)
        widths = [inp for _, inp in shapes]
        weights = [torch.rand(shape) - 0.5 for shape in shapes]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
        products: list[Callable[[torch.Tensor], object]]
        if native:
            products = [cpu_small_gemm.SmallGemm(w) for w in weights]
        else:
            products = [w.t().contiguous().__rmatmul__ for w in weights]  # x @ [in, out]
            del weights
        for count in counts:
            inputs = {width: torch.rand(count, width) for width in set(widths)}

            def on_packed(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for weight, width in zip(packed, widths, strict=True):
                    torch.ops.mkldnn._linear_pointwise(inputs[width], weight, None, "none", [], "")

            def on_copies(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for product, width in zip(products, widths, strict=True):
                    product(inputs[width])

            packed_s, rows_s = _median_alternating(on_packed, on_copies, reps)
            packed_times.append(packed_s)
            rows_times.append(rows_s)
    return RowWeightTiming(rows=counts, packed_s=tuple(packed_times), rows_s=tuple(rows_times))


@functools.cache
def _measured(num_threads: int, layer_shapes: tuple[tuple[int, int], ...]) -> RowWeightTiming:
    timing = time_row_products(layer_shapes)
    logger.info(
        "few-row products on %d thread(s), packed weight against the %s copy (ms): %s: the copy "
        "serves inputs of up to %d rows",
        num_threads,
        "panels (C kernel)" if row_copy_native() else "transposed",
        ", ".join(
            f"{rows} rows {p * 1e3:.2f} / {r * 1e3:.2f}"
            for rows, p, r in zip(timing.rows, timing.packed_s, timing.rows_s, strict=True)
        ),
        timing.row_inputs,
    )
    return timing


def measured_row_inputs(layer_shapes: Sequence[tuple[int, int]]) -> int:
    """Up to how many input rows the copies pay on this machine, for a model of these layer shapes
    (`ModelConfig.layer_linear_shapes`), at the current intra-op thread count; 0 where they do not
    (measured once per process, thread count and shapes, ~1-1.5 s)."""
    return _measured(torch.get_num_threads(), tuple(layer_shapes)).row_inputs
