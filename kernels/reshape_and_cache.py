"""Write this step's keys and values into their paged-cache slots.

One program per token copies all of its KV heads, for K and V, in one pass; the source may be
a strided view (the K and V columns of the fused qkv projection), so no `.contiguous()` copy
is needed first. A negative slot means "padding, do not write": CUDA-graph decode batches are
padded to a fixed size and their padding rows must not touch any real block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weir.kernels.checks import FLOAT_DTYPES, check_contiguous, check_dim, check_tensor, next_power_of_2


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    kv_ptr,
    slot_mapping_ptr,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kv_kind,
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_P2: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot >= 0:
        heads = tl.arange(0, HEADS_P2)
        dims = tl.arange(0, HEAD_DIM_P2)
        mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
        tok64 = tok.to(tl.int64)
        k = tl.load(
            key_ptr + tok64 * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :], mask=mask
        )
        v = tl.load(
            value_ptr + tok64 * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :], mask=mask
        )
        dst = (
            kv_ptr
            + (slot // PAGE_SIZE) * stride_kv_block
            + (slot % PAGE_SIZE) * stride_kv_slot
            + heads[:, None] * stride_kv_head
            + dims[None, :]
        )
        # through float32: a plain store of a bfloat16 load is fine on GPU but the CPU
        # interpreter handles bfloat16 only via conversions, and this costs nothing on a copy
        dtype = kv_ptr.dtype.element_ty
        tl.store(dst, k.to(tl.float32).to(dtype), mask=mask)
        tl.store(dst + stride_kv_kind, v.to(tl.float32).to(dtype), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (or int32); < 0 skips the token
) -> None:
    """Scatter keys and values into `kv_cache` at their slots (cast to the cache dtype).

    Same contract as `weir.kernels.reference.write_kv`, plus: negative slots are skipped.
    """
    check_tensor("kv_cache", kv_cache, ndim=5, dtypes=FLOAT_DTYPES)
    device = kv_cache.device
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("value", value, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    check_contiguous("slot_mapping", slot_mapping)
    check_dim("kv_cache", kv_cache, 0, 2, "K and V")
    _, _, page_size, num_kv_heads, head_dim = kv_cache.shape
    if kv_cache.stride(-1) != 1 or kv_cache.stride(-2) != head_dim:
        raise ValueError(f"kv_cache must be contiguous in its last two dimensions, got {kv_cache.stride()}")
    for name, t in (("key", key), ("value", value)):
        check_dim(name, t, 1, num_kv_heads, "kv_cache num_kv_heads")
        check_dim(name, t, 2, head_dim, "kv_cache head_dim")
    num_tokens = slot_mapping.shape[0]
    check_dim("key", key, 0, num_tokens, "len(slot_mapping)")
    check_dim("value", value, 0, num_tokens, "len(slot_mapping)")
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_P2=next_power_of_2(num_kv_heads),
        HEAD_DIM_P2=next_power_of_2(head_dim),
        PAGE_SIZE=page_size,
    )
