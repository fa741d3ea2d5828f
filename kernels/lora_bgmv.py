"""Gathered LoRA matmuls (Punica-style BGMV): each token multiplies by its own slot's factors.

The slot layout is engine/lora/lora_deltas.py's: `a` `[num_slots * width, in]` (slot s owns rows
`s * width : (s + 1) * width`) and, per target, `b` `[num_slots * rank, out]` (slot s owns rows
`s * rank : (s + 1) * rank`). `token_slots[t]` is token t's slot, -1 for a base-model token.

- `bgmv_shrink(x, a, token_slots, width)`: `out[t] = x[t] @ a[slot_t rows]^T` `[T, width]`;
  a base-model token gets zeros.
- `bgmv_expand_(y, t, b, token_slots)`: `y[t] += t[t] @ b[slot_t rows]` in place; a base-model
  token's row of y is not touched.

Unlike the masked dense form of the CPU path, a token reads only its own slot's factors, and no
FLOPs go to other slots' columns. One program per (token, block of output columns); the
reduction is a plain multiply-and-sum in float32 (decode rows are vectors, so no tl.dot), and
the result is rounded once to the output's dtype. Tested under the Triton interpreter against a
torch reference (tests/kernels/test_lora_bgmv.py). engine/lora/lora_deltas.py calls them on the model's
Triton path (CUDA); not yet measured on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weir.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_contiguous,
    check_dim,
    check_tensor,
    next_power_of_2,
)

_BLOCK_N = 32  # output columns per program
_BLOCK_K = 64  # reduction elements per iteration


@triton.jit
def _shrink_kernel(
    out_ptr,
    x_ptr,
    a_ptr,
    slots_ptr,
    stride_out,
    stride_x,
    stride_a,
    IN: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    base = tl.maximum(slot, 0) * WIDTH
    col_mask = cols < WIDTH
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, IN, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = (ks < IN) & (ks * 0 + slot >= 0)  # a base-model token reads nothing
        xv = tl.load(x_ptr + row * stride_x + ks, mask=k_mask, other=0.0).to(tl.float32)
        av = tl.load(
            a_ptr + (base + cols)[:, None] * stride_a + ks[None, :],
            mask=col_mask[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(out_ptr + row * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _expand_kernel(
    y_ptr,
    t_ptr,
    b_ptr,
    slots_ptr,
    stride_y,
    stride_t,
    stride_b,
    OUT: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    base = tl.maximum(slot, 0) * RANK
    rs = tl.arange(0, BLOCK_R)
    r_mask = (rs < RANK) & (rs * 0 + slot >= 0)
    col_mask = cols < OUT
    tv = tl.load(t_ptr + row * stride_t + rs, mask=r_mask, other=0.0).to(tl.float32)
    bv = tl.load(
        b_ptr + (base + rs)[:, None] * stride_b + cols[None, :],
        mask=r_mask[:, None] & col_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(tv[:, None] * bv, axis=0)
    y_addr = y_ptr + row * stride_y + cols
    store_mask = col_mask & (cols * 0 + slot >= 0)  # a base-model token's row is not written
    yv = tl.load(y_addr, mask=store_mask, other=0.0).to(tl.float32)
    tl.store(y_addr, (yv + delta).to(y_ptr.dtype.element_ty), mask=store_mask)


def _check_slots(token_slots: torch.Tensor, num_tokens: int, device: torch.device) -> None:
    check_tensor("token_slots", token_slots, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_contiguous("token_slots", token_slots)
    check_dim("token_slots", token_slots, 0, num_tokens, "x rows")


def bgmv_shrink(
    x: torch.Tensor,  # [num_tokens, in]
    a: torch.Tensor,  # [num_slots * width, in]
    token_slots: torch.Tensor,  # [num_tokens] int, -1: base model
    width: int,
) -> torch.Tensor:  # [num_tokens, width]
    """Each token's x times its slot's rows of `a` (transposed); zeros for base-model tokens."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("a", a, ndim=2, dtypes=(x.dtype,), device=x.device)
    check_dim("a", a, 1, x.shape[1], "x columns")
    if width < 1 or a.shape[0] % width:
        raise ValueError(f"width must be >= 1 and divide a's {a.shape[0]} rows, got {width}")
    _check_slots(token_slots, x.shape[0], x.device)
    out = torch.empty((x.shape[0], width), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    grid = (x.shape[0], triton.cdiv(width, _BLOCK_N))
    _shrink_kernel[grid](
        out, x, a, token_slots, out.stride(0), x.stride(0), a.stride(0),
        IN=x.shape[1], WIDTH=width, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K,
    )  # fmt: skip
    return out


def bgmv_expand_(
    y: torch.Tensor,  # [num_tokens, out] (a column slice of a wider output is fine)
    t: torch.Tensor,  # [num_tokens, rank]
    b: torch.Tensor,  # [num_slots * rank, out]
    token_slots: torch.Tensor,  # [num_tokens] int, -1: base model
) -> torch.Tensor:
    """y += each token's t times its slot's rows of `b`, in place; base-model rows untouched."""
    check_tensor("y", y, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("t", t, ndim=2, dtypes=(y.dtype,), device=y.device)
    check_tensor("b", b, ndim=2, dtypes=(y.dtype,), device=y.device)
    check_dim("t", t, 0, y.shape[0], "y rows")
    check_dim("b", b, 1, y.shape[1], "y columns")
    rank = t.shape[1]
    if rank < 1 or b.shape[0] % rank:
        raise ValueError(f"t's {rank} columns (the rank) must divide b's {b.shape[0]} rows")
    _check_slots(token_slots, y.shape[0], y.device)
    if y.shape[0] == 0:
        return y
    grid = (y.shape[0], triton.cdiv(y.shape[1], _BLOCK_N))
    _expand_kernel[grid](
        y, t, b, token_slots, y.stride(0), t.stride(0), b.stride(0),
        OUT=y.shape[1], RANK=rank, BLOCK_N=_BLOCK_N, BLOCK_R=next_power_of_2(rank),
    )  # fmt: skip
    return y
