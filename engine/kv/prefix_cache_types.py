"""The types of the prefix-cache admin API: its errors and its results (stats, shared prefixes, flushes).

The engine raises and returns these from its admin facade (`weir.engine.client.PrefixCacheControl`);
`weir.gateway.http.errors` maps the errors to HTTP and the admin routes turn the results into JSON.
Plain frozen dataclasses, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.engine.errors import EngineError, InvalidRequestError


class UnknownPrefixError(EngineError):
    """No shared prefix is registered under this id."""

    def __init__(self, prefix_id: str) -> None:
        super().__init__(f"no shared prefix {prefix_id!r} is registered")
        self.prefix_id = prefix_id


class InvalidPrefixError(InvalidRequestError):
    """A shared prefix the engine cannot take (too short or long, bad token ids, caching off).

    Its own type, so the admin API answers it as it answers its other field errors (422), while
    an `InvalidRequestError` from the OpenAI routes stays a 400.
    """


class PinCapacityError(InvalidPrefixError):
    """Pinning would hold more of the KV pool than pinned prefixes may take."""

    def __init__(self, num_blocks: int, max_blocks: int) -> None:
        super().__init__(
            f"pinning needs {num_blocks} blocks in all; pinned prefixes may hold at most {max_blocks}",
            param="pin",
        )


@dataclass(frozen=True)
class TenantCacheStats:
    """Prefix-cache figures of one tenant (lookups) and of its cache scope (contents)."""

    tenant_id: str
    cache_scope: str
    num_queries: int  # requests looked up
    num_queried_tokens: int
    num_hit_tokens: int
    num_cached_blocks: int  # blocks of its scope in the cache now
    num_cached_tokens: int
    num_evictions: int  # blocks of its scope evicted so far

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


@dataclass(frozen=True)
class ScopeCacheStats:
    """Cache contents of one scope (a tenant's, or the shared scope)."""

    cache_scope: str
    num_cached_blocks: int
    num_evictions: int


@dataclass(frozen=True)
class StoreCacheStats:
    """The shared KV store tier as this replica sees it (engine/kv/store/tier.py)."""

    breaker_state: str  # closed | open | half_open
    num_hit_blocks: int
    num_miss_blocks: int
    num_refused_blocks: int  # bad MAC or wrong length: never loaded
    num_landed_blocks: int  # copied into device blocks
    num_written_blocks: int
    num_dropped_writes: int
    bytes_read: int
    bytes_written: int
    max_bytes_per_scope: int  # each cache scope's cap in the store
    scope_bytes: tuple[tuple[str, int], ...] = ()  # a scope's bytes after this replica's last write


@dataclass(frozen=True)
class PrefixCacheStats:
    """The whole prefix cache: totals, per tenant, per scope."""

    enabled: bool
    model_version: str
    block_size: int
    num_total_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_pinned_blocks: int
    num_queries: int
    num_queried_tokens: int
    num_hit_tokens: int
    num_evictions: int
    num_flushed: int
    max_cached_blocks_per_scope: int  # the per-tenant cap
    tenants: tuple[TenantCacheStats, ...] = ()
    scopes: tuple[ScopeCacheStats, ...] = ()
    store: StoreCacheStats | None = None  # the shared KV store tier; None: off

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    @property
    def num_cached_tokens(self) -> int:
        return self.num_cached_blocks * self.block_size


@dataclass(frozen=True)
class SharedPrefixInfo:
    """A registered shared prefix. Only its full blocks are shared; the tail stays private."""

    prefix_id: str
    name: str
    num_tokens: int
    num_shared_tokens: int  # tokens in its full blocks
    num_blocks: int  # full blocks shared
    num_cached_blocks: int  # of those, cached now
    pinned: bool
    created_at: float  # epoch seconds


@dataclass(frozen=True)
class FlushResult:
    """What a flush removed."""

    num_blocks_flushed: int
    model_version_matched: bool = True
