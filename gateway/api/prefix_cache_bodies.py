"""The prefix-cache admin API's bodies (`/admin/v1/prefix-cache/...`), declared as pydantic models.

`/openapi.json` is generated from them, and `tests/gateway/api/test_openapi_admin.py` validates real
answers of `weir.gateway.routes.prefix_cache` against that document. The route still parses its
two request bodies by hand (issue 22 item 5 moves it onto the chat body model and these).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.engine.kv.prefix_cache_types import (
    PrefixCacheStats,
    SharedPrefixInfo,
    StoreCacheStats,
    TenantCacheStats,
)

NonEmpty = Annotated[str, Field(min_length=1)]


class PrefixRegisterBody(BaseModel):
    """`POST /admin/v1/prefix-cache/prefixes`: exactly one of token_ids, text, messages."""

    model_config = ConfigDict(extra="forbid")

    token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    text: NonEmpty | None = None
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = Field(
        default=None, description="Chat messages ({role, content}), rendered as the start of a chat."
    )
    add_special_tokens: bool = True
    name: NonEmpty | None = None
    pin: bool = False


class PrefixFlushBody(BaseModel):
    """`POST /admin/v1/prefix-cache/flush`: which cached blocks to drop (none given: all unpinned)."""

    model_config = ConfigDict(extra="forbid")

    model_version: NonEmpty | None = None
    tenant: NonEmpty | None = None
    cache_scope: NonEmpty | None = None
    include_pinned: bool = False


class TenantCacheStatsBody(BaseModel):
    """One tenant's prefix-cache figures."""

    model_config = ConfigDict(extra="forbid")

    tenant: str
    cache_scope: str
    queries: int
    queried_tokens: int
    hit_tokens: int
    hit_rate: float
    cached_blocks: int
    cached_tokens: int
    evictions: int

    @classmethod
    def of(cls, t: TenantCacheStats) -> TenantCacheStatsBody:
        return cls(
            tenant=t.tenant_id,
            cache_scope=t.cache_scope,
            queries=t.num_queries,
            queried_tokens=t.num_queried_tokens,
            hit_tokens=t.num_hit_tokens,
            hit_rate=t.hit_rate,
            cached_blocks=t.num_cached_blocks,
            cached_tokens=t.num_cached_tokens,
            evictions=t.num_evictions,
        )


class ScopeCacheStatsBody(BaseModel):
    """One cache scope's blocks."""

    model_config = ConfigDict(extra="forbid")

    cache_scope: str
    cached_blocks: int
    evictions: int


class StoreCacheStatsBody(BaseModel):
    """The shared KV store tier as this replica sees it (`--kv-store`)."""

    model_config = ConfigDict(extra="forbid")

    breaker_state: Literal["closed", "open", "half_open"]
    hit_blocks: int
    miss_blocks: int
    refused_blocks: int
    landed_blocks: int
    written_blocks: int
    dropped_writes: int
    bytes_read: int
    bytes_written: int
    max_bytes_per_tenant: int
    scope_bytes: dict[str, int]

    @classmethod
    def of(cls, s: StoreCacheStats) -> StoreCacheStatsBody:
        return cls.model_validate(store_json(s))


def store_json(s: StoreCacheStats) -> dict[str, Any]:
    """The store tier's part of the stats (the route's JSON and the body share it)."""
    return {
        "breaker_state": s.breaker_state,
        "hit_blocks": s.num_hit_blocks,
        "miss_blocks": s.num_miss_blocks,
        "refused_blocks": s.num_refused_blocks,
        "landed_blocks": s.num_landed_blocks,
        "written_blocks": s.num_written_blocks,
        "dropped_writes": s.num_dropped_writes,
        "bytes_read": s.bytes_read,
        "bytes_written": s.bytes_written,
        "max_bytes_per_tenant": s.max_bytes_per_scope,
        "scope_bytes": dict(s.scope_bytes),
    }


class PrefixCacheStatsBody(BaseModel):
    """The whole cache of one model version: totals, tenants, scopes."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["prefix_cache.stats"] = "prefix_cache.stats"
    enabled: bool
    model_version: str
    block_size: int
    total_blocks: int
    free_blocks: int
    cached_blocks: int
    cached_tokens: int
    pinned_blocks: int
    queries: int
    queried_tokens: int
    hit_tokens: int
    hit_rate: float
    evictions: int
    flushed: int
    max_cached_blocks_per_tenant: int
    tenants: list[TenantCacheStatsBody]
    scopes: list[ScopeCacheStatsBody]
    store: StoreCacheStatsBody | None = None  # the shared KV store tier; null: off

    @classmethod
    def of(cls, s: PrefixCacheStats) -> PrefixCacheStatsBody:
        return cls(
            enabled=s.enabled,
            model_version=s.model_version,
            block_size=s.block_size,
            total_blocks=s.num_total_blocks,
            free_blocks=s.num_free_blocks,
            cached_blocks=s.num_cached_blocks,
            cached_tokens=s.num_cached_tokens,
            pinned_blocks=s.num_pinned_blocks,
            queries=s.num_queries,
            queried_tokens=s.num_queried_tokens,
            hit_tokens=s.num_hit_tokens,
            hit_rate=s.hit_rate,
            evictions=s.num_evictions,
            flushed=s.num_flushed,
            max_cached_blocks_per_tenant=s.max_cached_blocks_per_scope,
            tenants=[TenantCacheStatsBody.of(t) for t in s.tenants],
            scopes=[
                ScopeCacheStatsBody(
                    cache_scope=c.cache_scope, cached_blocks=c.num_cached_blocks, evictions=c.num_evictions
                )
                for c in s.scopes
            ],
            store=StoreCacheStatsBody.of(s.store) if s.store is not None else None,
        )


class SharedPrefix(BaseModel):
    """A registered shared prefix."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["prefix_cache.prefix"] = "prefix_cache.prefix"
    id: str
    name: str
    num_tokens: int
    num_shared_tokens: int = Field(description="Tokens in its full blocks.")
    num_blocks: int = Field(description="Full blocks shared.")
    num_cached_blocks: int = Field(description="Of those, cached now.")
    pinned: bool
    created_at: float = Field(description="Epoch seconds.")

    @classmethod
    def of(cls, p: SharedPrefixInfo) -> SharedPrefix:
        return cls(
            id=p.prefix_id,
            name=p.name,
            num_tokens=p.num_tokens,
            num_shared_tokens=p.num_shared_tokens,
            num_blocks=p.num_blocks,
            num_cached_blocks=p.num_cached_blocks,
            pinned=p.pinned,
            created_at=p.created_at,
        )


class PrefixList(BaseModel):
    """`GET /admin/v1/prefix-cache/prefixes`."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["list"] = "list"
    data: list[SharedPrefix]


class PrefixCacheFlush(BaseModel):
    """What a flush dropped."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["prefix_cache.flush"] = "prefix_cache.flush"
    flushed_blocks: int
    model_version_matched: bool
