"""Tenant bodies: create (`POST /admin/v1/tenants`), update (`PATCH .../{name}`) and the tenant
object every tenant route answers.

A tenant's cache scope is its own unless it names one (`cache_scope`) or joins another tenant's
on purpose (`share_cache_scope_with`, audited); see `weir.tenancy.keys.cache_scopes`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.engine.request import Priority
from weir.tenancy.admin_bodies.fields import CacheScope, PriorityName, TenantName, UtcTime, Weight
from weir.tenancy.quota_limits import QuotaLimits
from weir.tenancy.repository.records import TenantSpec, TenantUpdate
from weir.tenancy.store.enums import TenantStatus

_SHARE = (
    "Join this existing tenant's cache scope on purpose (audited); not with cache_scope. "
    "A cache_scope that is another tenant's scope or name is refused (409 cache_scope_conflict)."
)


class TenantCreate(BaseModel):
    """`POST /admin/v1/tenants`: only `name` is required."""

    # model_validate(spec): the request body of a `TenantSpec` (what the CLI sends to a server).
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    name: TenantName
    priority: PriorityName | None = None
    weight: Weight | None = None
    cache_scope: CacheScope | None = Field(default=None, description="Default: the tenant's name.")
    share_cache_scope_with: TenantName | None = Field(default=None, description=_SHARE)
    quota: QuotaLimits | None = None

    def spec(self) -> TenantSpec:
        """The repository's input (defaults: standard priority, weight 1, no limits)."""
        return TenantSpec(
            name=self.name,
            priority=self.priority if self.priority is not None else Priority.STANDARD,
            weight=self.weight if self.weight is not None else 1.0,
            cache_scope=self.cache_scope,
            quota=self.quota if self.quota is not None else QuotaLimits(),
            share_cache_scope_with=self.share_cache_scope_with,
        )


class TenantPatch(BaseModel):
    """`PATCH /admin/v1/tenants/{name}`: at least one field; an absent or null one is unchanged."""

    # model_validate(change): the request body of a `TenantUpdate` (what the CLI sends).
    model_config = ConfigDict(extra="forbid", from_attributes=True, json_schema_extra={"minProperties": 1})

    priority: PriorityName | None = None
    weight: Weight | None = None
    cache_scope: CacheScope | None = None
    share_cache_scope_with: TenantName | None = Field(default=None, description=_SHARE)
    status: TenantStatus | None = None

    def update(self) -> TenantUpdate:
        """The repository's input (`FieldError("body")`, a 400, when it changes nothing)."""
        return TenantUpdate(**dict(self))  # the same fields


class Tenant(BaseModel):
    """A tenant as the admin API shows it."""

    # model_validate(view) of a `weir.tenancy.repository.records.TenantView`.
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    object: Literal["tenant"] = "tenant"
    name: TenantName
    status: TenantStatus
    priority: PriorityName
    weight: float
    cache_scope: str
    quota: QuotaLimits
    created_at: UtcTime
    updated_at: UtcTime


class TenantList(BaseModel):
    """`GET /admin/v1/tenants`."""

    object: Literal["list"] = "list"
    data: list[Tenant]
