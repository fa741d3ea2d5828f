"""The KV cache manager and its tiers, built from the engine's configuration at start and each reset.

`KVTiers.build` makes a fresh `KVCacheManager` over the runner's KV tensors: the device pool, the
host tier when `cache.host_num_blocks` is set (its copy bandwidth measured by the runner at
start-up), and the shared store tier when `kv_store` is configured. What outlives a reset lives
here, built once: the prefix cache's root digest (model version, tokenizer, RoPE, KV dtype, cache
scope, adapter: the first block's extra keys), the store's I/O threads and its monotonic fetch
decisions. The swap policy reads the engine's measured prefill rate, and the store tier its
estimated prefill time, at each decision (`weir.engine.measured_rates`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from weir.engine.config import EngineConfig, ModelConfig
from weir.engine.kv.block_hash import CacheKeyRoot
from weir.engine.kv.host_kv_tensors import HostKVCopier
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.kv.store.stats import FetchDecisions
from weir.engine.kv.store.tier import KVStoreTier, StoreIO
from weir.engine.kv.swap_policy import SwapPolicy
from weir.engine.measured_rates import MeasuredRates


class KVTiers:
    """Builds the engine's KV cache manager with its host and store tiers (fresh at each reset)."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        tokenizer_fp: str,
        num_blocks: int,
        host_kv: HostKVCopier | None,
        rates: MeasuredRates,
        clock: Callable[[], float],
        store_io: StoreIO | None,
    ) -> None:
        if config.cache.host_num_blocks and host_kv is None:
            raise ValueError("cache.host_num_blocks is set but the runner has no host KV cache")
        self.config = config
        self.model_config = model_config
        self.num_blocks = num_blocks
        self.host_kv = host_kv
        self.rates = rates
        self.clock = clock
        self.store_io = store_io
        self.store_decisions = FetchDecisions()  # monotonic: kept across reset()
        self._tokenizer_fp = tokenizer_fp
        self._rope_fp = model_config.rope.fingerprint()

    def root_digest(self, scope: str, adapter: str = "") -> bytes:
        """The first block's extra keys, hashed: a prefix is shared only under the same ones."""
        config = self.config
        return CacheKeyRoot(
            config.model_version, self._tokenizer_fp, self._rope_fp, config.cache.kv_dtype, scope, adapter
        ).digest()

    def build(self) -> KVCacheManager:
        """A fresh KV cache manager (the KV tensors are the runner's and stay)."""
        cache = self.config.cache
        kv = KVCacheManager(
            num_blocks=self.num_blocks,
            block_size=cache.block_size,
            root_digest=self.root_digest,
            enable_caching=cache.enable_prefix_caching,
            tenant_cache_share=cache.tenant_cache_share,
            host_num_blocks=cache.host_num_blocks,
            swap_policy=self._swap_policy(),
            store=self._store_tier(),
        )
        if kv.host is not None and self.host_kv is not None:
            kv.host.copy_bytes_per_s = self.host_kv.copy_bytes_per_s
        return kv

    def _store_tier(self) -> KVStoreTier | None:
        """The shared store tier's engine-thread state (fresh at each reset; its I/O and counters stay)."""
        store = self.config.kv_store
        if store is None or self.store_io is None:
            return None
        return KVStoreTier(
            self.store_io,
            namespace=store.namespace,
            model_version=self.config.model_version,
            block_size=self.config.cache.block_size,
            prefill_seconds=self.rates.prefill_seconds,
            timeout_s=store.timeout_s,
            max_fetch_bytes=store.max_fetch_bytes,
            ttl_s=store.ttl_s,
            clock=self.clock,
            decisions=self.store_decisions,
            tenant_share=self.config.cache.tenant_cache_share,
        )

    def _swap_policy(self) -> SwapPolicy:
        """Swap or recompute, from the copy bandwidth measured at start-up and the prefill rate
        measured as the engine runs (read at each preemption)."""
        mc, cache = self.model_config, self.config.cache
        block_bytes = cache.block_size * mc.kv_bytes_per_token(getattr(torch, cache.kv_dtype).itemsize)
        rates = self.rates
        return SwapPolicy(
            block_bytes=block_bytes,
            copy_bytes_per_s=self.host_kv.copy_bytes_per_s if self.host_kv is not None else 0.0,
            prefill_tokens_per_s=lambda: rates.prefill.value,
            mode=cache.preemption_mode,
        )
