"""y = x W^T (+ b) for a few rows of x in C, streaming a plain float32 weight once (CPU).

A decode step's linears multiply one to a few activation rows by each weight: bound by reading
the weight from memory. oneDNN's blocked weight streams at ~1.1-1.3x the time of a plain `sum`
over the same bytes on the hosts measured, MKL's GEMV over a transposed copy at 1.0-1.7x depending
on the host; the C kernel (`native/small_gemm.c`) reads the plain row-major weight once per call
with several independent accumulators per row and measured 0.88-0.93x the `sum`'s time over
SmolLM2's linears at one row, about even with `sum` at two, while at eight rows the multiply-adds
bound it and oneDNN is faster (docs/benchmarks.md, "Fifth stop"). Which row counts it takes is
measured per host (engine/models/row_weight_probe.py).

Results differ from `F.linear` by rounding only (another summation order).

`available()` is False where the kernel cannot be built (no C compiler, a failed build): callers
keep their torch path. The torch reference it is tested against is `torch.nn.functional.linear`.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.checks import check_tensor
from kernels.native import build

# native/small_gemm.c's MAX_ROWS: its loops are specialised for 1..8 input rows.
MAX_ROWS = 8

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    fn = build.function("small_gemm", "weir_small_gemm", [ctypes.c_void_p] * 4 + [_I64] * 3 + [ctypes.c_int])
    lib = build.load("small_gemm")
    if lib is not None and lib.weir_small_gemm_max_rows() != MAX_ROWS:
        raise RuntimeError("native/small_gemm.c and kernels/cpu_small_gemm.py disagree on MAX_ROWS")
    return fn


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


class SmallGemm:
    """One weight (and bias), checked once, multiplied against few-row inputs with the C kernel.

    A decode step calls ~120 linears: the per-call work is kept to the checks of `x` that guard
    the kernel's reads (dtype, rank, width, row count, contiguity)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        fn = _function()
        if fn is None:
            raise RuntimeError("the C small-GEMM kernel is not available (kernels.native.build)")
        check_tensor("weight", weight, ndim=2, dtypes=(torch.float32,), device=torch.device("cpu"))
        if not weight.is_contiguous():
            raise ValueError("weight must be contiguous")
        self.out_features, self.in_features = weight.shape
        if bias is not None:
            bias = check_tensor("bias", bias, ndim=1, dtypes=(torch.float32,), device=weight.device)
            if bias.shape[0] != self.out_features:
                raise ValueError(f"bias of {bias.shape[0]} for {self.out_features} output features")
            bias = bias.contiguous()
        self._fn = fn
        self.weight = weight
        self.bias = bias
        self._bias_ptr = None if bias is None else bias.data_ptr()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in_features] -> [rows, out_features]
        """x W^T (+ bias). ValueError on an input the kernel would misread."""
        if (
            not isinstance(x, torch.Tensor)
            or x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.dim() != 2
            or x.shape[1] != self.in_features
            or not 1 <= x.shape[0] <= MAX_ROWS
        ):
            raise ValueError(
                f"x must be a float32 CPU matrix of 1..{MAX_ROWS} rows of {self.in_features}, got "
                f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
            )
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        status = self._fn(
            x.data_ptr(),
            self.weight.data_ptr(),
            self._bias_ptr,
            y.data_ptr(),
            rows,
            self.in_features,
            self.out_features,
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError("the C kernel refused these sizes")
        return y


def small_gemm(
    x: torch.Tensor,  # [rows, in_features] float32, 1 <= rows <= MAX_ROWS
    weight: torch.Tensor,  # [out_features, in_features] float32, contiguous
    bias: torch.Tensor | None = None,  # [out_features] float32
) -> torch.Tensor:  # [rows, out_features]
    """x W^T (+ bias), checking everything on each call. ValueError on shapes, dtypes or row
    counts the kernel would misread."""
    return SmallGemm(weight, bias)(x)
