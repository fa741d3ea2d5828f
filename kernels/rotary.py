"""Rotary position embedding applied in place to q and k, by position, from a cos/sin table.

One program per token rotates all its query heads and all its key heads with one read of the
token's cos/sin row. The table is `weir.engine.models.rope.RotaryEmbedding`'s (any scaling type is baked
into it), in the "rotate half" layout: dimension i pairs with i + head_dim / 2.

q and k may be strided views into the fused qkv projection's output (they are rotated where
they lie, saving the two copies the torch path makes). The rotation is computed in float32
and rounded once, where torch rounds each product; in float32 the two agree to an ulp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weir.kernels.checks import FLOAT_DTYPES, check_contiguous, check_dim, check_tensor, next_power_of_2


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_head,
    cos,  # [1, HALF_P2] float32
    sin,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_P2: tl.constexpr,
    HALF_P2: tl.constexpr,
):
    heads = tl.arange(0, HEADS_P2)
    dims = tl.arange(0, HALF_P2)
    mask = (heads[:, None] < NUM_HEADS) & (dims[None, :] < HALF)
    first = x_ptr + heads[:, None] * stride_head + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(first, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    positions_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_table,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_P2: tl.constexpr,
    KV_HEADS_P2: tl.constexpr,
    HALF_P2: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    dims = tl.arange(0, HALF_P2)
    dim_ok = dims < HALF
    cos = tl.load(cos_ptr + pos * stride_table + dims, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * stride_table + dims, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr + tok * stride_q_tok, stride_q_head, cos, sin, NUM_HEADS, HALF, HEADS_P2, HALF_P2)
    _rotate_heads(
        k_ptr + tok * stride_k_tok, stride_k_head, cos, sin, NUM_KV_HEADS, HALF, KV_HEADS_P2, HALF_P2
    )


def apply_rotary_(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], rotated in place
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], rotated in place
    cos: torch.Tensor,  # [max_positions, head_dim // 2]
    sin: torch.Tensor,  # [max_positions, head_dim // 2]
    positions: torch.Tensor,  # [num_tokens] int64, each < max_positions (not checked: no host sync)
) -> None:
    """Rotate q and k in place by the angle of each token's position (rotate-half layout)."""
    check_tensor("cos", cos, ndim=2, dtypes=FLOAT_DTYPES)
    device = cos.device
    check_tensor("sin", sin, ndim=2, dtypes=(cos.dtype,), device=device)
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("key", key, ndim=3, dtypes=(query.dtype,), device=device)
    check_tensor("positions", positions, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    check_contiguous("positions", positions)
    num_tokens, num_heads, head_dim = query.shape
    if head_dim % 2:
        raise ValueError(f"query head_dim must be even for RoPE, got {head_dim}")
    half = head_dim // 2
    check_dim("cos", cos, 1, half, "head_dim // 2")
    if sin.shape != cos.shape or sin.stride() != cos.stride():
        raise ValueError(f"sin has shape {tuple(sin.shape)}, cos {tuple(cos.shape)}: they must match")
    check_dim("key", key, 0, num_tokens, "query tokens")
    check_dim("key", key, 2, head_dim, "query head_dim")
    check_dim("positions", positions, 0, num_tokens, "query tokens")
    if num_tokens == 0:
        return
    num_kv_heads = key.shape[1]
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        cos,
        sin,
        positions,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=half,
        HEADS_P2=next_power_of_2(num_heads),
        KV_HEADS_P2=next_power_of_2(num_kv_heads),
        HALF_P2=next_power_of_2(half),
    )
