"""SwiGLU activation: silu(gate) * up, from the fused gate/up projection's output.

The gate/up matmul writes `[num_tokens, 2 * intermediate]` (gate first). Unfused, torch splits
it, writes silu(gate) and reads it back for the product; fused, each element is read once and
the result written once. Rounding follows torch: silu is computed in float32 and rounded to the
activation dtype, then the product is rounded again, so float32 results are bit-identical up
to the exp implementation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weir.kernels.checks import FLOAT_DTYPES, check_dim, check_tensor

_BLOCK = 1024  # columns per program


@triton.jit
def _silu_mul_kernel(
    out_ptr,
    x_ptr,
    stride_out,
    stride_x,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTERMEDIATE + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(dtype), mask=mask)


def silu_mul(
    x: torch.Tensor,  # [num_tokens, 2 * intermediate]: gate then up
    out: torch.Tensor | None = None,  # [num_tokens, intermediate]
) -> torch.Tensor:  # [num_tokens, intermediate]
    """silu(x[:, :I]) * x[:, I:] with I = x.shape[1] // 2."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, width = x.shape
    if width % 2:
        raise ValueError(f"x must have an even last dimension (gate and up), got {width}")
    intermediate = width // 2
    if out is None:
        out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, ndim=2, dtypes=(x.dtype,), device=x.device)
        check_dim("out", out, 0, num_tokens, "x rows")
        check_dim("out", out, 1, intermediate, "x.shape[1] // 2")
    if num_tokens == 0:
        return out
    grid = (num_tokens, triton.cdiv(intermediate, _BLOCK))
    _silu_mul_kernel[grid](out, x, out.stride(0), x.stride(0), INTERMEDIATE=intermediate, BLOCK=_BLOCK)
    return out
