"""Plain-torch oracles for every kernel. They are also the engine's CPU path."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    """Scatter this step's keys and values into their cache slots."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def gather_kv(
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of positions [0, seq_len) of one sequence, each [seq_len, num_kv_heads, head_dim]."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    ids = block_table[:num_blocks].long()
    k = kv_cache[0].index_select(0, ids).flatten(0, 1)[:seq_len]
    v = kv_cache[1].index_select(0, ids).flatten(0, 1)[:seq_len]
    return k, v


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: Sequence[int],  # num_seqs + 1 offsets into the token dim
    seq_lens: Sequence[int],  # context length of each sequence, including its new tokens
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new tokens over its whole paged context.

    Decode rows (one query each) are batched into a single padded matmul; prefill chunks run
    one sequence at a time through scaled_dot_product_attention with an offset causal mask.
    """
    out = torch.empty_like(query)
    lens = [query_start_loc[i + 1] - query_start_loc[i] for i in range(len(seq_lens))]
    prefill_rows = [i for i, n in enumerate(lens) if n > 1]
    decode_rows = [i for i, n in enumerate(lens) if n == 1]
    prefill_attention_into(out, query, kv_cache, block_tables, query_start_loc, seq_lens, prefill_rows, scale)
    if decode_rows:
        out_rows = _decode_attention(
            query, kv_cache, block_tables, query_start_loc, seq_lens, decode_rows, scale
        )
        for row, i in enumerate(decode_rows):
            out[query_start_loc[i]] = out_rows[row]
    return out


ChunkAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def chunk_attention(
    query: torch.Tensor,  # [q, num_heads, head_dim]: the chunk's queries
    key: torch.Tensor,  # [n, num_kv_heads, head_dim]: the whole context, the chunk last
    value: torch.Tensor,  # [n, num_kv_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q, num_heads, head_dim]
    """Causal attention of one chunk over its context: one SDPA with the offset causal mask."""
    q_len, seq_len = query.shape[0], key.shape[0]
    q = query.transpose(0, 1)  # [num_heads, q_len, head_dim]
    k = key.transpose(0, 1)  # [num_kv_heads, seq_len, head_dim]
    v = value.transpose(0, 1)
    if q_len == seq_len:  # the whole sequence is new: plain causal attention
        o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # query j sits at position seq_len - q_len + j and sees keys 0..that position
        pos_q = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
        mask = torch.arange(seq_len, device=query.device)[None, :] <= pos_q  # [q_len, seq_len]
        o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.transpose(0, 1)


def prefill_attention_into(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written at the rows' tokens
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    rows: Sequence[int],  # sequences with more than one new token
    scale: float,
    attend: ChunkAttention = chunk_attention,
) -> None:
    """Causal attention of each listed sequence's chunk over its paged context, one `attend` each
    (the oracle's `chunk_attention`; the engine passes `weir.kernels.prefill_attention`'s)."""
    for i in rows:
        start, end = query_start_loc[i], query_start_loc[i + 1]
        k, v = gather_kv(kv_cache, block_tables[i], seq_lens[i])
        out[start:end] = attend(query[start:end], k, v, scale).to(out.dtype)


def _decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    rows: list[int],
    scale: float,
) -> torch.Tensor:  # [len(rows), num_heads, head_dim]
    """One query per sequence, all sequences in one padded SDPA call (GQA without copies)."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    num_heads = query.shape[1]
    lens = [seq_lens[i] for i in rows]
    max_blocks = (max(lens) + block_size - 1) // block_size
    padded_len = max_blocks * block_size
    idx = block_tables[rows, :max_blocks].reshape(-1).long()  # [B * max_blocks]
    k = kv_cache[0].index_select(0, idx).view(len(rows), padded_len, num_kv_heads, head_dim).transpose(1, 2)
    v = kv_cache[1].index_select(0, idx).view(len(rows), padded_len, num_kv_heads, head_dim).transpose(1, 2)
    q_idx = torch.tensor([query_start_loc[i] for i in rows], device=query.device)
    q = query.index_select(0, q_idx).to(k.dtype)[:, :, None, :]  # [B, num_heads, 1, head_dim]
    lens_t = torch.tensor(lens, device=query.device)
    valid = torch.arange(padded_len, device=query.device)[None, :] < lens_t[:, None]  # [B, padded_len]
    o = F.scaled_dot_product_attention(
        q, k, v, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True
    )
    o = o[:, :, 0]  # [B, num_heads, head_dim]
    return o.reshape(len(rows), num_heads, head_dim)
