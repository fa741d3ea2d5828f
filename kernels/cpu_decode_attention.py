"""Decode attention over the paged KV cache in C, reading the cache in place (CPU, float32).

The torch path (`weir.kernels.decode_attention`) gathers every decode row's K and V blocks into a
padded copy in each layer and runs SDPA over it. The C kernel (`native/decode_attention.c`)
walks each sequence's block table instead, with an online softmax per query head, so K and V are
read once and nothing is copied or padded; grouped-query heads share the KV head they read
(query head h uses KV head h // group, as in HF). Measured in the engine on SmolLM2, one thread:
a batch-8 step at 1,024 tokens of context 66.2 against 75.1 ms, within noise at 128 tokens, where
both paths wait on reading each layer's K/V from memory (docs/benchmarks.md, fourth stop).

`available()` is False where the kernel cannot be built (no C compiler, a failed build);
`supports()` is False where it does not apply (another dtype or device, a non-contiguous cache,
sizes past the kernel's fixed limits). Callers keep the torch path in both cases. The torch
reference it is tested against is `weir.kernels.reference.paged_attention`.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from weir.kernels import cpu_work_pool
from weir.kernels.checks import check_tensor
from weir.kernels.native import build

# The fixed per-call buffers of native/decode_attention.c.
MAX_HEADS = 1024
MAX_BLOCK = 128

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    fn = build.function(
        "decode_attention",
        "weir_decode_attention",
        [ctypes.c_void_p] * 5 + [_I64] * 7 + [ctypes.c_float, ctypes.c_int, ctypes.c_int],
    )
    if fn is not None:
        cpu_work_pool.connect("decode_attention")
    return fn


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def supports(kv_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether this cache (and query head count) is within the kernel's reach."""
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    return (
        kv_cache.device.type == "cpu"
        and kv_cache.dtype == torch.float32
        and kv_cache.is_contiguous()
        and num_heads % num_kv_heads == 0
        and num_heads <= MAX_HEADS
        and block_size <= MAX_BLOCK
    )


@dataclass(frozen=True)
class NativePlan:
    """A step's decode rows as the kernel reads them, checked once for every layer."""

    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, contiguous
    seq_lens: torch.Tensor  # [num_seqs] int32, contiguous
    max_block_id: int  # the largest block id a row reads: each layer's cache must hold it


def plan(block_tables: torch.Tensor, seq_lens: Sequence[int], block_size: int) -> NativePlan:
    """The kernel's view of a step's decode rows; ValueError on lengths past the tables."""
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32, torch.int64))
    num_seqs, max_blocks = block_tables.shape
    if num_seqs != len(seq_lens) or num_seqs == 0:
        raise ValueError(f"{num_seqs} block tables for {len(seq_lens)} sequences (at least one)")
    if min(seq_lens) < 1 or max(seq_lens) > max_blocks * block_size:
        raise ValueError(
            f"context lengths must be in [1, {max_blocks * block_size}], got {min(seq_lens)}..{max(seq_lens)}"
        )
    used = block_tables[:, : (max(seq_lens) + block_size - 1) // block_size]
    if int(used.min()) < 0:
        raise ValueError("block ids must be >= 0")
    return NativePlan(
        block_tables=block_tables.to(torch.int32).contiguous(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        max_block_id=int(used.max()),
    )


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim] float32, one query per sequence
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim] float32, contiguous
    native: NativePlan,
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's query over its whole paged context. ValueError on arguments the kernel
    would misread (see `supports`; a plan whose blocks this cache does not hold)."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C decode attention kernel is not available (weir.kernels.native.build)")
    check_tensor("kv_cache", kv_cache, ndim=5, dtypes=(torch.float32,), device=torch.device("cpu"))
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    query = check_tensor("query", query, ndim=3, dtypes=(torch.float32,), device=kv_cache.device)
    num_seqs, num_heads, q_dim = query.shape
    if q_dim != head_dim or not supports(kv_cache, num_heads):
        raise ValueError(
            f"query {tuple(query.shape)} against a cache of {num_kv_heads} KV heads of {head_dim} "
            f"in blocks of {block_size}: outside the kernel (a contiguous cache, heads a multiple of "
            f"the KV heads and <= {MAX_HEADS}, blocks <= {MAX_BLOCK})"
        )
    if native.seq_lens.shape[0] != num_seqs or native.max_block_id >= num_blocks:
        raise ValueError(
            f"a plan of {native.seq_lens.shape[0]} sequences reading block {native.max_block_id} "
            f"for {num_seqs} queries and a cache of {num_blocks} blocks"
        )
    if not query.is_contiguous():
        query = query.contiguous()
    out = torch.empty_like(query)
    threads, pool = cpu_work_pool.kernel_threads()
    status = fn(
        query.data_ptr(),
        kv_cache.data_ptr(),
        native.block_tables.data_ptr(),
        native.seq_lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        num_blocks,
        block_size,
        native.block_tables.shape[1],
        scale,
        threads,
        pool,
    )
    if status != 0:
        raise ValueError("the C kernel refused these sizes")
    return out
