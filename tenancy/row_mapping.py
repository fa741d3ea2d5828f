"""Between the database rows (`tenancy.models`) and the detached records (`tenancy.records`).

The repository returns views built here, so no caller ever holds a row bound to a session; and
quota writes and their audit details are spelt once, field by field, here.
"""

from __future__ import annotations

import datetime as dt

from tenancy.context import QuotaLimits
from tenancy.enums import KeyScope
from tenancy.models import ApiKey, KeyLimit, Quota, Tenant
from tenancy.records import ApiKeyView, TenantView


def quota_view(row: Quota | None) -> QuotaLimits:
    """A quota row's limits (no row: unlimited)."""
    if row is None:
        return QuotaLimits()
    return QuotaLimits(
        tokens_per_minute=row.tokens_per_minute,
        requests_per_minute=row.requests_per_minute,
        tokens_per_day=row.tokens_per_day,
        max_concurrent=row.max_concurrent,
        max_prompt_tokens=row.max_prompt_tokens,
        max_output_tokens=row.max_output_tokens,
        models=tuple(row.models),
        ttft_slo_ms=row.ttft_slo_ms,
        tpot_slo_ms=row.tpot_slo_ms,
        default_max_tokens_reservation=row.default_max_tokens_reservation,
    )


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
    if row is None:
        return QuotaLimits()
    return QuotaLimits(
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
        tokens_per_day=row.tokens_per_day,
        max_concurrent=row.max_concurrent,
        max_prompt_tokens=row.max_prompt_tokens,
        max_output_tokens=row.max_output_tokens,
        models=tuple(row.models),
    )


def apply_key_limits(row: KeyLimit, limits: QuotaLimits, now: dt.datetime) -> None:
    """Overwrite every limit of a key's row (None: the tenant's)."""
    row.requests_per_minute = limits.requests_per_minute
    row.tokens_per_minute = limits.tokens_per_minute
    row.tokens_per_day = limits.tokens_per_day
    row.max_concurrent = limits.max_concurrent
    row.max_prompt_tokens = limits.max_prompt_tokens
    row.max_output_tokens = limits.max_output_tokens
    row.models = list(limits.models)
    row.updated_at = now


def apply_quota(row: Quota, quota: QuotaLimits, now: dt.datetime) -> None:
    """Overwrite every limit of a quota row (None: unlimited)."""
    row.tokens_per_minute = quota.tokens_per_minute
    row.requests_per_minute = quota.requests_per_minute
    row.tokens_per_day = quota.tokens_per_day
    row.max_concurrent = quota.max_concurrent
    row.max_prompt_tokens = quota.max_prompt_tokens
    row.max_output_tokens = quota.max_output_tokens
    row.models = list(quota.models)
    row.ttft_slo_ms = quota.ttft_slo_ms
    row.tpot_slo_ms = quota.tpot_slo_ms
    row.default_max_tokens_reservation = quota.default_max_tokens_reservation
    row.updated_at = now
