"""Allocation of the per-layer paged KV cache tensors the model writes and attends over."""

from __future__ import annotations

import torch

from weir.engine.config import CacheConfig, ModelConfig

# Budget when CacheConfig names neither num_blocks nor memory_budget_bytes
DEFAULT_CPU_BUDGET_BYTES = 1 << 30
DEFAULT_CUDA_FREE_FRACTION = 0.6


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


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block occupies across all layers (K and V)."""
    return block_size * config.kv_bytes_per_token(dtype.itemsize)


def num_blocks_for(
    cache: CacheConfig,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | None = None,
) -> int:
    """How many blocks to allocate (all of them, including any the block pool reserves).

    `cache.num_blocks` wins; else `cache.memory_budget_bytes`; else a default budget: a share
    of the free memory on CUDA (call after the weights are loaded), 1 GiB on CPU.
    """
    if cache.num_blocks is not None:
        return cache.num_blocks
    block_bytes = kv_block_bytes(config, cache.block_size, dtype)
    if cache.memory_budget_bytes is not None:
        budget = cache.memory_budget_bytes
    elif device is not None and device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        budget = int(free_bytes * DEFAULT_CUDA_FREE_FRACTION)
    else:
        budget = DEFAULT_CPU_BUDGET_BYTES
    num_blocks = budget // block_bytes
    if num_blocks < 2:
        raise ValueError(
            f"memory_budget_bytes={budget} holds {num_blocks} KV block(s) of {block_bytes} bytes; need at least 2"
        )
    return num_blocks
