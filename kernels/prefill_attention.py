"""Chunked-prefill attention on the CPU: the cached prefix without a mask, the chunk causal,
merged by their log-sum-exps.

A chunk of `q` new tokens at the end of a context of `n` sees every one of the `p = n - q` cached
tokens before it, and the chunk itself causally. `reference.chunk_attention` (the oracle) gives
SDPA the whole `[q, n]` boolean mask; with a mask and GQA, torch's CPU SDPA runs its math
path (batched matmuls, a masked softmax, checks for fully masked rows): ~48 GFLOP/s on two
cores, and it computes the masked half of the chunk too.

Here each part is one call to torch's CPU flash-attention kernel, which returns the log-sum-exp
of each query's scores with its output:
- the prefix: no mask at all; the query heads sharing a KV head are that head's queries
  (`[kv_heads, group * q, head_dim]`), so K/V are not repeated;
- the chunk: `is_causal` (the chunk is square), its `q` keys repeated per query head (small);
- merged exactly: `out = o1 * exp(l1 - l) + o2 * exp(l2 - l)` with `l = logaddexp(l1, l2)`.
Measured per layer on SmolLM2's heads (`weir_bench.experiments.prefill_attention`, two runs,
docs/benchmarks.md): 1.8-3.0x faster for 256-token chunks over 256-768 tokens, 2.0x for 64 over
600, even (1.0-1.1x) for 32 over 100.

The flash kernel is a private op (`aten::_scaled_dot_product_flash_attention_for_cpu`, in torch
since 2.2); where it is missing `best_chunk_attention` gives the oracle's instead. The paged loop
over a step's prefill rows is `reference.prefill_attention_into`, given the chunk attention.
"""

from __future__ import annotations

import torch

from weir.kernels import reference

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def available() -> bool:
    """Whether this torch has the CPU flash-attention op."""
    return _FLASH is not None


def chunk_attention(
    query: torch.Tensor,  # [q, num_heads, head_dim]: the chunk's queries
    key: torch.Tensor,  # [n, num_kv_heads, head_dim]: the whole context, the chunk last
    value: torch.Tensor,  # [n, num_kv_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q, num_heads, head_dim]
    """Causal attention of the chunk over its context (module docstring)."""
    assert _FLASH is not None
    q_len, num_heads, head_dim = query.shape
    seq_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    prefix = seq_len - q_len
    q = query.to(key.dtype).transpose(0, 1)  # [num_heads, q, head_dim]
    k = key.transpose(0, 1)  # [num_kv_heads, n, head_dim]
    v = value.transpose(0, 1)
    k_chunk = k[:, prefix:].repeat_interleave(group, 0)[None]
    v_chunk = v[:, prefix:].repeat_interleave(group, 0)[None]
    out_chunk, lse_chunk = _FLASH(q[None], k_chunk, v_chunk, is_causal=True, scale=scale)[:2]
    out_chunk, lse_chunk = out_chunk[0], lse_chunk[0]  # [num_heads, q, head_dim], [num_heads, q]
    if prefix == 0:
        return out_chunk.transpose(0, 1)
    grouped = q.reshape(num_kv_heads, group * q_len, head_dim)[None]
    out_prefix, lse_prefix = _FLASH(grouped, k[None, :, :prefix], v[None, :, :prefix], scale=scale)[:2]
    out_prefix = out_prefix.reshape(num_heads, q_len, head_dim)
    lse_prefix = lse_prefix.reshape(num_heads, q_len)
    lse = torch.logaddexp(lse_prefix, lse_chunk)
    w_prefix = torch.exp(lse_prefix - lse).unsqueeze(-1).to(out_prefix.dtype)
    w_chunk = torch.exp(lse_chunk - lse).unsqueeze(-1).to(out_chunk.dtype)
    return (out_prefix * w_prefix + out_chunk * w_chunk).transpose(0, 1)


def best_chunk_attention() -> reference.ChunkAttention:
    """`chunk_attention` where this torch has the flash op, else the oracle's masked SDPA."""
    return chunk_attention if _FLASH is not None else reference.chunk_attention
