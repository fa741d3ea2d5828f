"""Random mixed steps (prefill chunks + decode rows) over a randomly filled paged KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata


@dataclass(frozen=True)
class Step:
    """One step's tensors: new tokens' q/k/v, a cache holding their context, and the metadata."""

    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    metadata: AttentionMetadata


def random_step(
    q_lens: Sequence[int],
    num_cached: Sequence[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> Step:
    """Sequence i has `num_cached[i]` tokens in the cache and adds `q_lens[i]` this step.

    Blocks are shuffled (a sequence's pages are scattered and out of order) and block 0 is
    left out, like the engine's null block; table padding points at it.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(num_cached, q_lens, strict=True)]
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 3  # a few spare blocks nobody owns
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables: list[list[int]] = []
    for n in blocks_per_seq:
        tables.append(ids[:n])
        ids = ids[n:]
    width = max(max(blocks_per_seq), 1)
    padded = [t + [0] * (width - len(t)) for t in tables]
    starts = [0]
    slots: list[int] = []
    for table, cached, q_len in zip(tables, num_cached, q_lens, strict=True):
        starts.append(starts[-1] + q_len)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + q_len)]
    num_tokens = starts[-1]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    kv_cache = rand(2, num_blocks, block_size, num_kv_heads, head_dim)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        query_start_loc_cpu=tuple(starts),
        seq_lens_cpu=tuple(seq_lens),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
    return Step(
        query=rand(num_tokens, num_heads, head_dim),
        key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        kv_cache=kv_cache,
        metadata=metadata,
    )
