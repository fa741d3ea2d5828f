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
from weir.tenancy.repository.records import TenantSpec, TenantUpdate, TenantView
from weir.tenancy.store.enums import TenantStatus

_SHARE = (
    "Join this existing tenant's cache scope on purpose (audited); not with cache_scope. "
    "A cache_scope that is another tenant's scope or name is refused (409 cache_scope_conflict)."
)


class TenantCreate(BaseModel):
    """`POST /admin/v1/tenants`: only `name` is required."""

    model_config = ConfigDict(extra="forbid")

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

    @classmethod
    def of(cls, spec: TenantSpec) -> TenantCreate:
        """The request body for `spec` (what the CLI sends to a server)."""
        return cls(
            name=spec.name,
            priority=spec.priority,
            weight=spec.weight,
            cache_scope=spec.cache_scope,
            share_cache_scope_with=spec.share_cache_scope_with,
            quota=spec.quota,
        )


class TenantPatch(BaseModel):
    """`PATCH /admin/v1/tenants/{name}`: at least one field; an absent or null one is unchanged."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    priority: PriorityName | None = None
    weight: Weight | None = None
    cache_scope: CacheScope | None = None
    share_cache_scope_with: TenantName | None = Field(default=None, description=_SHARE)
    status: TenantStatus | None = None

    def update(self) -> TenantUpdate:
        """The repository's input (`FieldError("body")`, a 400, when it changes nothing)."""
        return TenantUpdate(
            priority=self.priority,
            weight=self.weight,
            cache_scope=self.cache_scope,
            status=self.status,
            share_cache_scope_with=self.share_cache_scope_with,
        )

    @classmethod
    def of(cls, change: TenantUpdate) -> TenantPatch:
        """The request body for `change` (what the CLI sends to a server)."""
        return cls(
            priority=change.priority,
            weight=change.weight,
            cache_scope=change.cache_scope,
            share_cache_scope_with=change.share_cache_scope_with,
            status=change.status,
        )


class Tenant(BaseModel):
    """A tenant as the admin API shows it."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["tenant"] = "tenant"
    name: TenantName
    status: TenantStatus
    priority: PriorityName
    weight: float
    cache_scope: str
    quota: QuotaLimits
    created_at: UtcTime
    updated_at: UtcTime

    @classmethod
    def of(cls, view: TenantView) -> Tenant:
        return cls(
            name=view.name,
            status=view.status,
            priority=view.priority,
            weight=view.weight,
            cache_scope=view.cache_scope,
            quota=view.quota,
            created_at=view.created_at,
            updated_at=view.updated_at,
        )


class TenantList(BaseModel):
    """`GET /admin/v1/tenants`."""

    object: Literal["list"] = "list"
    data: list[Tenant]
