"""Typed values passed between the tenancy repository and its callers (admin API, CLI, auth).

Inputs validate themselves on construction and raise `FieldError` naming the field; outputs
(`*View`) are plain snapshots of rows, detached from any database session.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field

from weir.engine.request import Priority
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.errors import FieldError
from weir.tenancy.keys.keys import key_prefix
from weir.tenancy.quota_limits import KEY_LIMIT_FIELDS, QUOTA_FIELDS, parse_quota_limits, quota_values
from weir.tenancy.store.enums import (
    ALL_KEY_SCOPES,
    KeyScope,
    KeyState,
    TenantStatus,
)
from weir.tenancy.store.field_rules import check_aware, validate_tenant_name

CACHE_SCOPE_RE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
MAX_WEIGHT = 1e6


def validate_weight(weight: float, field_name: str = "weight") -> float:
    """A fair-share weight: a finite number in (0, 1e6]."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise FieldError(field_name, "must be a number")
    if not math.isfinite(weight) or weight <= 0 or weight > MAX_WEIGHT:
        raise FieldError(field_name, f"must be > 0 and <= {MAX_WEIGHT:g}")
    return float(weight)


def validate_cache_scope(scope: str, field_name: str = "cache_scope") -> str:
    """A prefix-cache scope: 1-128 of [A-Za-z0-9._:/-]."""
    if not isinstance(scope, str) or CACHE_SCOPE_RE.fullmatch(scope) is None:
        raise FieldError(field_name, "must be 1-128 characters of A-Z, a-z, 0-9, '.', '_', ':', '/' or '-'")
    return scope


def validate_quota(quota: QuotaLimits, prefix: str = "quota.") -> QuotaLimits:
    """Check a quota's ranges against its declaration (QuotaLimits itself does not validate on
    construction); return it with `models` as a tuple."""
    return parse_quota_limits(quota_values(quota, QUOTA_FIELDS), prefix.rstrip(".") or "body")


def validate_key_limits(limits: QuotaLimits, tenant: QuotaLimits, prefix: str = "limits.") -> QuotaLimits:
    """Check a key's own limits: ranges, only the fields a key may set, and models within its tenant's.

    Numeric limits wider than the tenant's are accepted (the tighter applies at run time, and the
    tenant's may be lowered later); a model outside a tenant's list could never be used, so it is
    refused here.
    """
    validate_quota(limits, prefix)
    for name in QUOTA_FIELDS:
        if name not in KEY_LIMIT_FIELDS and getattr(limits, name) is not None:
            raise FieldError(prefix + name, "is a tenant setting; a key cannot set it")
    if tenant.models:
        outside = [m for m in limits.models if m not in tenant.models]
        if outside:
            raise FieldError(prefix + "models", f"not allowed to the key's tenant: {', '.join(outside)}")
    return limits


def _check_share(cache_scope: str | None, share_with: str | None, own_name: str | None) -> None:
    if share_with is None:
        return
    validate_tenant_name(share_with, "share_cache_scope_with")
    if cache_scope is not None:
        raise FieldError(
            "share_cache_scope_with", "give either cache_scope or share_cache_scope_with, not both"
        )
    if share_with == own_name:
        raise FieldError("share_cache_scope_with", "must name another tenant")


@dataclass(frozen=True)
class TenantSpec:
    """What is needed to create a tenant."""

    name: str
    priority: Priority = Priority.STANDARD
    weight: float = 1.0
    cache_scope: str | None = None  # None: the tenant's own name (nothing shared)
    quota: QuotaLimits = field(default_factory=QuotaLimits)
    # Join this existing tenant's cache scope on purpose (audited); the only way to share one.
    share_cache_scope_with: str | None = None

    def __post_init__(self) -> None:
        validate_tenant_name(self.name)
        if not isinstance(self.priority, Priority):
            raise FieldError("priority", "must be one of interactive, standard, batch")
        validate_weight(self.weight)
        if self.cache_scope is not None:
            validate_cache_scope(self.cache_scope)
        validate_quota(self.quota)
        _check_share(self.cache_scope, self.share_cache_scope_with, self.name)


@dataclass(frozen=True)
class TenantUpdate:
    """A partial update of a tenant; None leaves a field unchanged."""

    priority: Priority | None = None
    weight: float | None = None
    cache_scope: str | None = None
    status: TenantStatus | None = None
    share_cache_scope_with: str | None = None  # join this tenant's cache scope on purpose

    def __post_init__(self) -> None:
        if self.priority is not None and not isinstance(self.priority, Priority):
            raise FieldError("priority", "must be one of interactive, standard, batch")
        if self.weight is not None:
            validate_weight(self.weight)
        if self.cache_scope is not None:
            validate_cache_scope(self.cache_scope)
        if self.status is not None and not isinstance(self.status, TenantStatus):
            raise FieldError("status", "must be one of active, suspended")
        _check_share(self.cache_scope, self.share_cache_scope_with, None)
        if all(
            value is None
            for value in (
                self.priority,
                self.weight,
                self.cache_scope,
                self.status,
                self.share_cache_scope_with,
            )
        ):
            raise FieldError(
                "body", "give at least one of priority, weight, cache_scope, share_cache_scope_with, status"
            )


@dataclass(frozen=True)
class KeySpec:
    """What is needed to issue a key for a tenant."""

    scopes: tuple[KeyScope, ...] = ALL_KEY_SCOPES
    expires_at: dt.datetime | None = None  # None: never expires

    def __post_init__(self) -> None:
        if not self.scopes:
            raise FieldError("scopes", "must name at least one scope")
        if any(not isinstance(s, KeyScope) for s in self.scopes):
            raise FieldError("scopes", f"each scope must be one of {', '.join(s.value for s in KeyScope)}")
        if len(set(self.scopes)) != len(self.scopes):
            raise FieldError("scopes", "must not repeat a scope")
        check_aware(self.expires_at, "expires_at")


@dataclass(frozen=True)
class TenantView:
    """A tenant and its quota as stored."""

    name: str
    status: TenantStatus
    priority: Priority
    weight: float
    cache_scope: str
    quota: QuotaLimits
    created_at: dt.datetime
    updated_at: dt.datetime

    def context(
        self, key_id: str, scopes: tuple[str, ...], key_quota: QuotaLimits | None = None
    ) -> TenantContext:
        """The TenantContext of a request made with one of this tenant's keys (and its own limits)."""
        return TenantContext(
            tenant_id=self.name,
            key_id=key_id,
            priority=self.priority,
            weight=self.weight,
            cache_scope=self.cache_scope,
            quota=self.quota,
            scopes=scopes,
            key_quota=key_quota if key_quota is not None else QuotaLimits(),
        )


@dataclass(frozen=True)
class ApiKeyView:
    """An API key's metadata; never its secret."""

    id: str
    tenant: str
    scopes: tuple[KeyScope, ...]
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None
    limits: QuotaLimits = field(default_factory=QuotaLimits)  # the key's own, nested in the tenant's

    @property
    def prefix(self) -> str:
        """The displayable start of the key, enough to recognise it."""
        return key_prefix(self.id)

    def state(self, now: dt.datetime) -> KeyState:
        """Revoked wins over expired; both are refused the same way."""
        if self.revoked_at is not None:
            return KeyState.REVOKED
        if self.expires_at is not None and self.expires_at <= now:
            return KeyState.EXPIRED
        return KeyState.ACTIVE


@dataclass(frozen=True)
class IssuedKey:
    """A newly issued key: the only object that ever holds the whole secret key."""

    key: str = field(repr=False)
    view: ApiKeyView


@dataclass(frozen=True)
class KeyRecord:
    """What authentication needs about a key: its hash, its state and its tenant."""

    view: ApiKeyView
    secret_hash: str = field(repr=False)
    tenant: TenantView
