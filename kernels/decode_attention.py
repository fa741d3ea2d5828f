"""Batched decode attention over the paged KV cache in plain torch (the CPU path of a decode step).

`reference.paged_attention` handles any mix of prefill and decode and rebuilds everything per
layer. A decode-only step has one query per sequence and the same block tables in every layer,
so here the per-step work is done once (`plan_decode`: the flat block index and the padding
mask) and each layer runs four ops:

1. one `index_select` of K and V together (`[2, B * max_blocks, ...]`, a single copy);
2. views to `[B, kv_heads, L, head_dim]`;
3. one `scaled_dot_product_attention` where the query heads sharing a KV head are that head's
   queries (`[B, kv_heads, group, head_dim]`): grouped-query attention without repeating K/V;
4. a view back to `[B, num_heads, head_dim]` (query head h uses KV head h // group, as in HF).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DecodePlan:
    """What every layer of one decode-only step shares."""

    block_index: torch.Tensor  # [num_seqs * max_blocks] int64, rows padded with block 0
    mask: torch.Tensor | None  # [num_seqs, 1, 1, padded_len] bool; None when no row is padded
    num_seqs: int
    padded_len: int  # max_blocks * block_size


def plan_decode(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: Sequence[int],  # context length of each sequence, this step's token included
    block_size: int,
) -> DecodePlan:
    """The flat block index and padding mask of a decode-only step (one query per sequence)."""
    num_seqs = len(seq_lens)
    if num_seqs == 0 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if min(seq_lens) < 1:
        raise ValueError(f"every sequence needs a context of >= 1 token, got {min(seq_lens)}")
    max_blocks = (max(seq_lens) + block_size - 1) // block_size
    if max_blocks > block_tables.shape[1]:
        raise ValueError(
            f"a context of {max(seq_lens)} tokens needs {max_blocks} blocks, the table has {block_tables.shape[1]}"
        )
    padded_len = max_blocks * block_size
    index = block_tables[:, :max_blocks].reshape(-1).long()  # [B * max_blocks]
    mask = None
    if min(seq_lens) < padded_len:
        lens = torch.tensor(seq_lens, device=block_tables.device)
        positions = torch.arange(padded_len, device=block_tables.device)
        mask = (positions[None, :] < lens[:, None])[:, None, None, :]  # [B, 1, 1, padded_len]
    return DecodePlan(index, mask, num_seqs, padded_len)


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query per sequence
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    plan: DecodePlan,
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's query attends over its whole paged context (see the module docstring)."""
    _, _, _, num_kv_heads, head_dim = kv_cache.shape
    num_seqs, num_heads, q_dim = query.shape
    if num_seqs != plan.num_seqs or q_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"query {tuple(query.shape)} does not fit {plan.num_seqs} sequences of "
            f"{num_kv_heads} KV heads of {head_dim}"
        )
    group = num_heads // num_kv_heads
    kv = kv_cache.index_select(1, plan.block_index)  # [2, B * max_blocks, block_size, kv_heads, head_dim]
    kv = kv.view(2, num_seqs, plan.padded_len, num_kv_heads, head_dim).transpose(2, 3)  # [2, B, kvh, L, hd]
    q = query.to(kv.dtype).view(num_seqs, num_kv_heads, group, head_dim)  # [B, kvh, group, hd]
    out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=plan.mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)  # [B, num_heads, head_dim]
