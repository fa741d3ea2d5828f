"""Allocation of the per-layer paged KV cache tensors the model writes and attends over."""

from __future__ import annotations

import torch

from engine.config import ModelConfig


def kv_cache_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, int, int, int, int]:
    """Shape of one layer's cache: `[2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]`."""
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return (2, num_blocks, block_size, config.num_kv_heads, config.head_dim)


def allocate_kv_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One zeroed cache tensor per layer (see `kv_cache_shape`).

    Zeroed rather than empty: padded key slots are masked with -inf scores, but a NaN left in
    uninitialised memory would still poison the probs @ V product (0 * NaN = NaN).
    """
    shape = kv_cache_shape(config, num_blocks, block_size)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
