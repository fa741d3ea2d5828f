"""argmax over each row of float32 logits in C (the CPU sampler's greedy rows).

`argmax_rows(x)` is `x.argmax(dim=-1)` for a float32 CPU matrix: the first index of each row's
largest value, a NaN counting as larger than any number (torch's rule). torch's CPU argmax walks
a row one value at a time: 0.6 ms a step at 8 rows of SmolLM2's 49,152 logits, measured; the C
kernel (`native/argmax_rows.c`) compares sixteen at a time.

`available()` is False where the kernel cannot be built (no C compiler): callers keep torch's.
Tested against `torch.argmax`, ties, infinities and NaNs included.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels.native import build

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function("argmax_rows", "weir_argmax_rows", [ctypes.c_void_p] * 2 + [_I64] * 3)


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def argmax_rows(x: torch.Tensor) -> torch.Tensor:  # [rows, cols] float32 -> [rows] int64
    """`x.argmax(dim=-1)`. ValueError on a tensor the kernel would misread (another dtype or
    device, not a matrix, no columns); rows that are not laid out in place are copied first."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C argmax kernel is not available (weir.kernels.native.build)")
    shape = x.shape
    if len(shape) != 2 or x.dtype != torch.float32 or not x.is_cpu or shape[1] == 0:
        raise ValueError(f"x must be a float32 CPU matrix with columns, got {x.dtype} {tuple(shape)}")
    if x.stride(1) != 1 or x.stride(0) < shape[1]:
        x = x.contiguous()
    out = torch.empty(shape[0], dtype=torch.int64)
    if shape[0] and fn(x.data_ptr(), out.data_ptr(), shape[0], shape[1], x.stride(0)) != 0:
        raise ValueError("the C kernel refused these sizes")
    return out
