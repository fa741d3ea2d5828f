"""Unified paged attention for a mixed step: prefill chunks and decode rows in one launch.

Each program owns one (sequence, KV head, tile of query tokens). Its rows are the query heads
that share that KV head, packed with the query tokens (row r = token r // G, head r % G for a
group of G = num_heads / num_kv_heads), so every K/V tile read from the cache serves the whole
group: GQA and MQA read the cache once per KV head, not once per query head. Keys are
gathered through the block table one key at a time, so any page size works and tiles of keys
may straddle pages. The softmax is computed online (running max and sum, in float32, base 2).

Causality is offset: a sequence's new tokens are the last `q_len` of its `seq_len` context,
so query j sees keys `0 .. seq_len - q_len + j`. A decode row is the case q_len = 1.

The launch depends only on tensor shapes and `max_query_len`, never on the values of the
sequence lengths, so a decode step can be captured in a CUDA graph and replayed with new
lengths and block tables.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from weir.kernels.checks import FLOAT_DTYPES, check_contiguous, check_dim, check_tensor, next_power_of_2

# Rows of one program: query tokens x heads of a KV group. 16 is tl.dot's minimum.
_DECODE_BLOCK_M = 16
_PREFILL_BLOCK_M = 64
_BLOCK_N = 32  # keys per inner iteration


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,  # softmax scale * log2(e): exp2 is cheaper than exp
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kv_kind,  # K -> V
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    stride_bt_seq,
    GROUP: tl.constexpr,  # query heads per KV head
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program, >= BLOCK_Q * GROUP
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        num_cached = seq_len - q_len  # context before this step's tokens

        rows = tl.arange(0, BLOCK_M)
        q_idx = q_tile * BLOCK_Q + rows // GROUP  # token index within this step's chunk
        head = kv_head * GROUP + rows % GROUP
        row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
        dims = tl.arange(0, HEAD_DIM_P2)
        dim_ok = dims < HEAD_DIM
        q_off = (q_start + q_idx).to(tl.int64)[:, None] * stride_q_tok + head[:, None] * stride_q_head
        q = tl.load(q_ptr + q_off + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        q_pos = num_cached + q_idx  # [BLOCK_M] absolute position of each row's token

        # keys up to the last query position of this tile
        kv_end = tl.minimum(seq_len, num_cached + (q_tile + 1) * BLOCK_Q)
        # finite start: a row whose whole tile is masked keeps alpha = 1 instead of NaN
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], dtype=tl.float32)
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
        for key_start in range(0, kv_end, BLOCK_N):
            keys = key_start + tl.arange(0, BLOCK_N)
            key_ok = keys < kv_end
            block = tl.load(bt_row + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
            kv_off = block * stride_kv_block + (keys % PAGE_SIZE) * stride_kv_slot + kv_head * stride_kv_head
            kv_mask = key_ok[:, None] & dim_ok[None, :]
            k = tl.load(kv_ptr + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [N, D]
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale_log2  # [BLOCK_M, BLOCK_N]
            visible = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(kv_ptr + stride_kv_kind + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        l_i = tl.where(l_i == 0.0, 1.0, l_i)  # padding rows: nothing visible, output zeros
        acc = acc / l_i[:, None]
        o_off = (q_start + q_idx).to(tl.int64)[:, None] * stride_o_tok + head[:, None] * stride_o_head
        tl.store(
            out_ptr + o_off + dims[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new tokens over its whole paged context.

    Same contract as `weir.kernels.reference.paged_attention`, but the per-sequence offsets and
    lengths are device tensors (nothing is read back to the host). The keys and values of this
    step's tokens must already be in the cache. `query` and `out` may be strided views as long
    as their last dimension is contiguous.
    """
    check_tensor("kv_cache", kv_cache, ndim=5, dtypes=FLOAT_DTYPES)
    device = kv_cache.device
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), device=device)
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=(torch.int32,), device=device)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=device)
    check_contiguous("block_tables", block_tables)
    check_contiguous("query_start_loc", query_start_loc)
    check_contiguous("seq_lens", seq_lens)
    if query.dtype != kv_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} differs from kv_cache dtype {kv_cache.dtype}")
    _, _, page_size, num_kv_heads, head_dim = kv_cache.shape
    check_dim("kv_cache", kv_cache, 0, 2, "K and V")
    check_dim("query", query, 2, head_dim, "kv_cache head_dim")
    num_tokens, num_heads, _ = query.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"query has {num_heads} heads, not a multiple of kv_cache's {num_kv_heads} KV heads")
    num_seqs = seq_lens.shape[0]
    check_dim("query_start_loc", query_start_loc, 0, num_seqs + 1, "len(seq_lens) + 1")
    check_dim("block_tables", block_tables, 0, num_seqs, "len(seq_lens)")
    if kv_cache.stride(-1) != 1 or kv_cache.stride(-2) != head_dim:
        raise ValueError(f"kv_cache must be contiguous in its last two dimensions, got {kv_cache.stride()}")
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    else:
        check_tensor("out", out, ndim=3, dtypes=(query.dtype,), device=device)
        if out.shape != query.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(query.shape)}")
    if num_tokens == 0 or num_seqs == 0:
        return out

    group = num_heads // num_kv_heads
    block_m = _DECODE_BLOCK_M if max_query_len == 1 else _PREFILL_BLOCK_M
    block_m = max(block_m, next_power_of_2(group))
    block_q = max(1, block_m // group)
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _paged_attention_kernel[grid](
        out,
        query,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale * math.log2(math.e),
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        GROUP=group,
        PAGE_SIZE=page_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=max(16, next_power_of_2(head_dim)),
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=_BLOCK_N,
        IEEE=query.dtype == torch.float32,
    )
    return out
