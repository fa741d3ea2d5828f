"""RMSNorm of float32 rows in C, optionally after the residual add (CPU).

`add_rms_norm(x, residual, weight, eps)` adds `x` into the residual stream in place and returns
its RMSNorm (without a residual, the RMSNorm of `x`): the CPU counterpart of the Triton
`weir.kernels.rms_norm.fused_add_rms_norm`. On a decode row the torch form is an add and six ops
(`F.rms_norm` in float32 on CPU is composite), each a dispatch of a few microseconds, twice a
layer; the C kernel (`native/rms_norm.c`) is one ctypes call. Results differ from the torch form
by rounding only (another order of the sum of squares).

`available()` is False where the kernel cannot be built (no C compiler): callers keep the torch
form. Tested against `weir.kernels.reference` and Hugging Face's formula.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels.native import build

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function(
        "rms_norm", "weir_add_rms_norm", [ctypes.c_void_p] * 4 + [_I64, _I64, ctypes.c_float]
    )


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def _misread(t: torch.Tensor, dim: int) -> bool:
    return t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 2 or t.shape[1] != dim


def add_rms_norm(
    x: torch.Tensor,  # [rows, dim] float32
    residual: torch.Tensor | None,  # [rows, dim] float32, contiguous: x is added into it in place
    weight: torch.Tensor,  # [dim] float32, contiguous
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed [rows, dim], the residual stream: residual, else x)
    """RMSNorm(residual + x) with the sum written back to `residual`; without one, RMSNorm(x).
    ValueError on tensors the kernel would misread (checked with the least work: twice a layer)."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C RMSNorm kernel is not available (weir.kernels.native.build)")
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 1:
        raise ValueError(f"weight must be a float32 CPU vector, got {weight.dtype} {tuple(weight.shape)}")
    dim = weight.shape[0]
    if _misread(x, dim) or (
        residual is not None
        and (_misread(residual, dim) or residual.shape[0] != x.shape[0] or not residual.is_contiguous())
    ):
        raise ValueError(
            f"x {x.dtype} {tuple(x.shape)} and residual "
            f"{None if residual is None else (residual.dtype, tuple(residual.shape))} must be float32 CPU "
            f"matrices of the same rows of {dim} (the residual contiguous)"
        )
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not x.is_contiguous():
        x = x.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    out = torch.empty_like(x)
    status = fn(
        x.data_ptr(),
        None if residual is None else residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        dim,
        eps,
    )
    if status != 0:
        raise ValueError("the C kernel refused these sizes")
    return out, (x if residual is None else residual)
