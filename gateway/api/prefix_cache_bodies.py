"""The prefix-cache admin API's bodies (`/admin/v1/prefix-cache/...`), declared as pydantic models.

`/openapi.json` is generated from them, and `tests/gateway/api/test_openapi_admin.py` validates real
answers of `weir.gateway.routes.prefix_cache` against that document. The route answers with these
models, read off the engine's records (`weir.engine.kv.prefix_cache_types`) by `model_validate`:
a field takes the record's attribute of its own name, else the one with a `num_` prefix (the
engine's name for a count), else the one its `validation_alias` names. The route still parses its
two request bodies by hand (issue 22 item 5 moves it onto the chat body model and these).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, AliasGenerator, BaseModel, BeforeValidator, ConfigDict, Field

NonEmpty = Annotated[str, Field(min_length=1)]


def _own_or_count(field: str) -> AliasChoices:
    return AliasChoices(field, f"num_{field}")


class _EngineFigures(BaseModel):
    """An answer made with `model_validate(record)` of one of the engine's prefix-cache records."""

    model_config = ConfigDict(
        extra="forbid",
        from_attributes=True,
        alias_generator=AliasGenerator(validation_alias=_own_or_count),
    )


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


class TenantCacheStatsBody(_EngineFigures):
    """One tenant's prefix-cache figures."""

    tenant: str = Field(validation_alias=AliasChoices("tenant", "tenant_id"))
    cache_scope: str
    queries: int
    queried_tokens: int
    hit_tokens: int
    hit_rate: float
    cached_blocks: int
    cached_tokens: int
    evictions: int


class ScopeCacheStatsBody(_EngineFigures):
    """One cache scope's blocks."""

    cache_scope: str
    cached_blocks: int
    evictions: int


class StoreCacheStatsBody(_EngineFigures):
    """The shared KV store tier as this replica sees it (`--kv-store`)."""

    breaker_state: Literal["closed", "open", "half_open"]
    hit_blocks: int
    miss_blocks: int
    refused_blocks: int
    landed_blocks: int
    written_blocks: int
    dropped_writes: int
    bytes_read: int
    bytes_written: int
    max_bytes_per_tenant: int = Field(
        validation_alias=AliasChoices("max_bytes_per_tenant", "max_bytes_per_scope")
    )
    scope_bytes: Annotated[dict[str, int], BeforeValidator(dict)]  # the engine's (scope, bytes) pairs


class PrefixCacheStatsBody(_EngineFigures):
    """The whole cache of one model version: totals, tenants, scopes."""

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
    max_cached_blocks_per_tenant: int = Field(
        validation_alias=AliasChoices("max_cached_blocks_per_tenant", "max_cached_blocks_per_scope")
    )
    tenants: list[TenantCacheStatsBody]
    scopes: list[ScopeCacheStatsBody]
    store: StoreCacheStatsBody | None = None  # the shared KV store tier; null: off


class SharedPrefix(_EngineFigures):
    """A registered shared prefix."""

    object: Literal["prefix_cache.prefix"] = "prefix_cache.prefix"
    id: str = Field(validation_alias=AliasChoices("id", "prefix_id"))
    name: str
    num_tokens: int
    num_shared_tokens: int = Field(description="Tokens in its full blocks.")
    num_blocks: int = Field(description="Full blocks shared.")
    num_cached_blocks: int = Field(description="Of those, cached now.")
    pinned: bool
    created_at: float = Field(description="Epoch seconds.")


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
