"""The prefix cache's admin facade: stats, shared prefixes and flushes, on both sides of the engine thread.

`PrefixCacheAdmin` does the work on the engine thread, where it may touch the KV cache manager
directly (`LLMEngine.prefix_cache`). `AsyncPrefixCache` is what callers on the event loop hold
(`AsyncEngine.prefix_cache`, an `weir.engine.client.PrefixCacheControl`): each of its calls runs the
matching `PrefixCacheAdmin` method on the engine thread. Results and errors are the types of
`weir.engine.kv.prefix_cache_types`. Plain Python, no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from weir.engine.client import EngineRequest
from weir.engine.errors import InvalidRequestError
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.kv.prefix_cache_types import (
    FlushResult,
    InvalidPrefixError,
    PrefixCacheStats,
    ScopeCacheStats,
    SharedPrefixInfo,
    StoreCacheStats,
    TenantCacheStats,
)
from weir.engine.request import Priority, SamplingParams

T = TypeVar("T")

ADMIN_TENANT = "<admin>"  # tenant and scope of the requests that compute registered prefixes


class PrefixCacheAdmin:
    """Stats and administration of one engine's prefix cache; runs on the engine thread."""

    def __init__(self, kv: KVCacheManager, model_version: str, vocab_size: int) -> None:
        self.kv = kv
        self.model_version = model_version
        self.vocab_size = vocab_size
        self._warmups = itertools.count()

    # -- stats ------------------------------------------------------------------------------------

    def stats(self) -> PrefixCacheStats:
        """Totals, per tenant (lookups, and its scope's contents) and per scope."""
        kv, pool = self.kv, self.kv.pool
        bs = kv.block_size
        tenants = []
        for tenant_id, c in sorted(kv.lookup.by_tenant.items()):
            scope = kv.lookup.scope_of_tenant.get(tenant_id, tenant_id)
            num_cached = pool.num_cached_blocks(scope)
            tenants.append(
                TenantCacheStats(
                    tenant_id=tenant_id,
                    cache_scope=scope,
                    num_queries=c.num_queries,
                    num_queried_tokens=c.queried_tokens,
                    num_hit_tokens=c.hit_tokens,
                    num_cached_blocks=num_cached,
                    num_cached_tokens=num_cached * bs,
                    num_evictions=pool.evictions_by_scope.get(scope, 0),
                )
            )
        scope_names = sorted(
            {s for s, n in pool.cached_blocks_by_scope.items() if n} | set(pool.evictions_by_scope)
        )
        scopes = tuple(
            ScopeCacheStats(s, pool.num_cached_blocks(s), pool.evictions_by_scope.get(s, 0))
            for s in scope_names
        )
        return PrefixCacheStats(
            enabled=kv.enable_caching,
            model_version=self.model_version,
            block_size=bs,
            num_total_blocks=kv.num_total_blocks,
            num_free_blocks=kv.num_free_blocks,
            num_cached_blocks=len(pool.cached),
            num_pinned_blocks=pool.num_pinned_blocks,
            num_queries=kv.lookup.totals.num_queries,
            num_queried_tokens=kv.lookup.totals.queried_tokens,
            num_hit_tokens=kv.lookup.totals.hit_tokens,
            num_evictions=pool.num_evictions,
            num_flushed=pool.num_flushed,
            max_cached_blocks_per_scope=kv.max_cached_blocks_per_scope,
            tenants=tuple(tenants),
            scopes=scopes,
            store=self._store_stats(),
        )

    def _store_stats(self) -> StoreCacheStats | None:
        if self.kv.store is None:
            return None
        s = self.kv.store.stats()
        io = s.io
        return StoreCacheStats(
            breaker_state=s.breaker_state.name.lower(),
            num_hit_blocks=io.num_hit_blocks,
            num_miss_blocks=io.num_miss_blocks,
            num_refused_blocks=io.num_bad_mac + io.num_bad_length,
            num_landed_blocks=s.decisions.num_landed_blocks,
            num_written_blocks=io.num_written_blocks,
            num_dropped_writes=io.num_dropped_writes,
            bytes_read=io.bytes_read,
            bytes_written=io.bytes_written,
            max_bytes_per_scope=s.max_entries_per_scope * s.value_bytes,
            scope_bytes=tuple((k, n * s.value_bytes) for k, n in sorted(io.scope_entries.items())),
        )

    # -- shared prefixes --------------------------------------------------------------------------

    def register(self, token_ids: Sequence[int], name: str = "", pin: bool = False) -> SharedPrefixInfo:
        """Register a shared prefix (idempotent) and optionally pin it; see `warmup_request`."""
        if not self.kv.enable_caching:
            raise InvalidPrefixError("prefix caching is disabled on this engine", "token_ids")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in token_ids):
            raise InvalidPrefixError(f"token ids must be in [0, {self.vocab_size})", "token_ids")
        if len(token_ids) + 1 > self.kv.num_total_blocks * self.kv.block_size:
            raise InvalidPrefixError("the prefix does not fit the KV cache", "token_ids")
        prefixes = self.kv.shared_prefixes
        return prefixes.info(prefixes.register(list(token_ids), name, pin))

    def warmup_request(self, prefix_id: str) -> EngineRequest | None:
        """A request that computes the prefix's missing blocks, or None when all are cached."""
        prefix = self.kv.shared_prefixes.get(prefix_id)
        if all(self.kv.pool.lookup(h) is not None for h in prefix.hashes):
            return None
        return EngineRequest(
            request_id=f"prefix-warmup-{prefix_id}-{next(self._warmups)}",
            prompt_token_ids=prefix.token_ids,
            sampling_params=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
            tenant_id=ADMIN_TENANT,
            priority=Priority.INTERACTIVE,
            cache_scope=ADMIN_TENANT,
        )

    def list_prefixes(self) -> tuple[SharedPrefixInfo, ...]:
        prefixes = self.kv.shared_prefixes
        return tuple(prefixes.info(p) for p in prefixes.prefixes())

    def get(self, prefix_id: str) -> SharedPrefixInfo:
        prefixes = self.kv.shared_prefixes
        return prefixes.info(prefixes.get(prefix_id))

    def pin(self, prefix_id: str) -> SharedPrefixInfo:
        prefixes = self.kv.shared_prefixes
        return prefixes.info(prefixes.pin(prefix_id))

    def unpin(self, prefix_id: str) -> SharedPrefixInfo:
        prefixes = self.kv.shared_prefixes
        return prefixes.info(prefixes.unpin(prefix_id))

    def unregister(self, prefix_id: str) -> SharedPrefixInfo:
        """Forget a prefix; its blocks stay cached (evictable) until evicted or flushed."""
        prefixes = self.kv.shared_prefixes
        return prefixes.info(prefixes.unregister(prefix_id))

    # -- flushes ----------------------------------------------------------------------------------

    def flush(
        self,
        model_version: str | None = None,
        tenant_id: str | None = None,
        cache_scope: str | None = None,
        include_pinned: bool = False,
    ) -> FlushResult:
        """Forget cached blocks: all of this model version's, or one tenant's (its scope's), or one scope's.

        Blocks in use stay with their requests. Pinned shared blocks stay unless `include_pinned`.
        """
        if model_version is not None and model_version != self.model_version:
            return FlushResult(0, model_version_matched=False)
        scopes: set[str] | None = None
        if tenant_id is not None:
            scopes = {self.kv.lookup.scope_of_tenant.get(tenant_id, tenant_id)}
        if cache_scope is not None:
            scopes = (scopes or set()) | {cache_scope}
        return FlushResult(self.kv.flush(scopes, include_pinned=include_pinned))


class RunOnEngineThread(Protocol):
    """Runs `fn(admin)` on the engine thread and resolves with its result (or its exception)."""

    def __call__(self, fn: Callable[[PrefixCacheAdmin], T]) -> Awaitable[T]: ...


class AsyncPrefixCache:
    """The `PrefixCacheControl` of an engine running on another thread (see the module docstring).

    Registering or pinning a prefix also computes its missing blocks, with a request of its own,
    so the call returns once they are cached.
    """

    def __init__(
        self,
        on_engine_thread: RunOnEngineThread,
        generate: Callable[[EngineRequest], AsyncIterator[object]],
        snapshot: Callable[[], PrefixCacheStats],
    ) -> None:
        self._run = on_engine_thread
        self._generate = generate
        self._snapshot = snapshot

    async def stats(self) -> PrefixCacheStats:
        """Fresh stats: totals, per tenant, per scope."""
        return await self._run(lambda admin: admin.stats())

    def snapshot(self) -> PrefixCacheStats:
        """The stats the engine thread copied last (about once a second), without waiting."""
        return self._snapshot()

    async def register(self, token_ids: Sequence[int], name: str = "", pin: bool = False) -> SharedPrefixInfo:
        """Register a shared prefix and compute its blocks; returns once they are cached."""
        ids = list(token_ids)
        info = await self._run(lambda admin: admin.register(ids, name, pin))
        return await self._warm(info.prefix_id)

    async def _warm(self, prefix_id: str) -> SharedPrefixInfo:
        warmup = await self._run(lambda admin: admin.warmup_request(prefix_id))
        if warmup is not None:
            try:
                async for _ in self._generate(warmup):
                    pass
            except InvalidRequestError as exc:  # the engine refuses the prefix's own request
                raise InvalidPrefixError(exc.message, exc.param) from exc
        return await self._run(lambda admin: admin.get(prefix_id))

    async def list_prefixes(self) -> tuple[SharedPrefixInfo, ...]:
        return await self._run(lambda admin: admin.list_prefixes())

    async def get(self, prefix_id: str) -> SharedPrefixInfo:
        return await self._run(lambda admin: admin.get(prefix_id))

    async def pin(self, prefix_id: str) -> SharedPrefixInfo:
        """Pin a prefix (recomputing blocks evicted meanwhile): its blocks are never evicted."""
        await self._run(lambda admin: admin.pin(prefix_id))
        return await self._warm(prefix_id)

    async def unpin(self, prefix_id: str) -> SharedPrefixInfo:
        return await self._run(lambda admin: admin.unpin(prefix_id))

    async def unregister(self, prefix_id: str) -> SharedPrefixInfo:
        return await self._run(lambda admin: admin.unregister(prefix_id))

    async def flush(
        self,
        model_version: str | None = None,
        tenant_id: str | None = None,
        cache_scope: str | None = None,
        include_pinned: bool = False,
    ) -> FlushResult:
        """Forget cached blocks of this model version, of one tenant, or of one scope."""
        return await self._run(
            lambda admin: admin.flush(model_version, tenant_id, cache_scope, include_pinned)
        )
