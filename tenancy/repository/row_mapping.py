"""Between the database rows (`weir.tenancy.store.models`) and the detached records (`weir.tenancy.repository.records`).

The repository returns views built here, so no caller ever holds a row bound to a session; and
quota reads and writes iterate the fields declared in `weir.tenancy.quota_limits`.
"""

from __future__ import annotations

import datetime as dt

from weir.tenancy.quota_limits import (
    KEY_LIMIT_FIELDS,
    QUOTA_FIELDS,
    QuotaLimits,
    quota_from,
    quota_values,
)
from weir.tenancy.repository.records import ApiKeyView, TenantView
from weir.tenancy.store.enums import KeyScope
from weir.tenancy.store.models import ApiKey, KeyLimit, Quota, Tenant


def quota_view(row: Quota | None) -> QuotaLimits:
    """A quota row's limits (no row: unlimited)."""
    return QuotaLimits() if row is None else quota_from(row, QUOTA_FIELDS)


def tenant_view(row: Tenant) -> TenantView:
    """A tenant row and its quota, detached."""
    return TenantView(
        name=row.name,
        status=row.status,
        priority=row.priority,
        weight=row.weight,
        cache_scope=row.cache_scope,
        quota=quota_view(row.quota),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def key_view(row: ApiKey, tenant_name: str) -> ApiKeyView:
    """A key row's metadata, detached; never its secret hash."""
    return ApiKeyView(
        id=row.id,
        tenant=tenant_name,
        scopes=tuple(KeyScope(s) for s in row.scopes),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        limits=key_limits_view(row.limits),
    )


def key_limits_view(row: KeyLimit | None) -> QuotaLimits:
    """A key's own limits (no row: none of its own)."""
    return QuotaLimits() if row is None else quota_from(row, KEY_LIMIT_FIELDS)


def _apply(row: Quota | KeyLimit, limits: QuotaLimits, names: tuple[str, ...], now: dt.datetime) -> None:
    for name, value in quota_values(limits, names).items():
        setattr(row, name, value)
    row.updated_at = now


def apply_key_limits(row: KeyLimit, limits: QuotaLimits, now: dt.datetime) -> None:
    """Overwrite every limit of a key's row (None: the tenant's)."""
    _apply(row, limits, KEY_LIMIT_FIELDS, now)


def apply_quota(row: Quota, quota: QuotaLimits, now: dt.datetime) -> None:
    """Overwrite every limit of a quota row (None: unlimited)."""
    _apply(row, quota, QUOTA_FIELDS, now)
