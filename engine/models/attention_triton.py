"""The Triton attention backend: cache write + unified paged attention, two launches per layer.

It lives in engine/ (not kernels/) so that kernels/ stays a leaf that imports nothing from engine/.

It implements `weir.engine.models.attention.AttentionBackend`. Unlike the torch path it reads only the
device tensors of `AttentionMetadata` (never the host tuples, never `.item()`), so a decode
step through it can be captured in a CUDA graph and replayed with new metadata values.
"""

from __future__ import annotations

import torch

from weir.engine.models.attention import AttentionBackend, AttentionMetadata
from weir.kernels.paged_attention import paged_attention
from weir.kernels.reshape_and_cache import reshape_and_cache


class TritonAttentionBackend(AttentionBackend):
    """Writes K/V with `reshape_and_cache`, then attends with `paged_attention`."""

    uses_triton = True

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        _check_block_size(kv_cache, metadata)
        reshape_and_cache(key, value, kv_cache, metadata.slot_mapping)

    def attend(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Attend over each sequence's paged context; this step's K/V are already in the cache."""
        _check_block_size(kv_cache, metadata)
        out = paged_attention(
            query.to(kv_cache.dtype),  # a lower-precision cache: attend in its dtype, like the torch path
            kv_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.max_query_len,
            scale,
        )
        return out.to(query.dtype)


def _check_block_size(kv_cache: torch.Tensor, metadata: AttentionMetadata) -> None:
    if metadata.block_size != kv_cache.shape[2]:
        raise ValueError(
            f"metadata.block_size={metadata.block_size} but kv_cache has blocks of {kv_cache.shape[2]}"
        )
