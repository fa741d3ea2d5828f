"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block.

Unfused, a decoder layer reads the hidden state three times per norm (add, square-mean,
scale) and writes it twice; fused, one program per row reads x and the residual once, writes
the new residual and the normalised row once.

Numerics follow `weir.engine.models.llama_layers.RMSNorm` (Hugging Face's order): the sum is rounded to
the activation dtype (it is the residual stream), the variance and scaling are in float32,
the normalised row is rounded to the activation dtype, then multiplied by the weight and
rounded again. Only the order of the mean's summation differs from torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weir.kernels.checks import FLOAT_DTYPES, check_dim, check_tensor, next_power_of_2


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    x_ptr,
    residual_ptr,  # read and overwritten with x + residual when HAS_RESIDUAL
    weight_ptr,
    stride_out,
    stride_x,
    stride_res,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(residual_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + res).to(dtype)  # the residual stream lives in the activation dtype
        tl.store(residual_ptr + row * stride_res + cols, x, mask=mask)
        x = x.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / HIDDEN
    normed = (x * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(dtype), mask=mask)


def _check(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    check_tensor(name, x, ndim=2, dtypes=(weight.dtype,), device=weight.device)
    check_dim(name, x, 1, weight.shape[0], "len(weight)")


def rms_norm(
    x: torch.Tensor,  # [num_rows, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    out: torch.Tensor | None = None,  # [num_rows, hidden]
) -> torch.Tensor:  # [num_rows, hidden]
    """weight * normalise(x) per row; x may be row-strided, its last dimension contiguous."""
    _check("x", x, weight)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        _check("out", out, weight)
        check_dim("out", out, 0, x.shape[0], "x rows")
    _launch(out, x, None, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_rows, hidden]
    residual: torch.Tensor,  # [num_rows, hidden], updated in place to x + residual
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normalised [num_rows, hidden], residual)
    """residual += x (in place), then return (weight * normalise(residual), residual)."""
    _check("x", x, weight)
    _check("residual", residual, weight)
    check_dim("residual", residual, 0, x.shape[0], "x rows")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _launch(out, x, residual, weight, eps)
    return out, residual


def _launch(
    out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> None:
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    num_rows, hidden = x.shape
    if num_rows == 0:
        return
    block = next_power_of_2(hidden)
    _rms_norm_kernel[(num_rows,)](
        out,
        x,
        residual if residual is not None else x,  # unused when HAS_RESIDUAL is False
        weight,
        out.stride(0),
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        num_warps=4 if block <= 2048 else 8,
    )
