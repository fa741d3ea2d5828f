"""The JSON shapes of the admin API, both ways, shared by the HTTP routes and the CLI.

Parsing is strict: unknown fields are refused (a misspelt quota field must not silently mean
"unlimited"), and every error is a `FieldError` naming the field.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.request import Priority
from tenancy.context import QuotaLimits, key_limits_dict
from tenancy.enums import KeyScope, TenantStatus
from tenancy.errors import FieldError
from tenancy.records import (
    ApiKeyView,
    AuditEventView,
    DailyUsage,
    IssuedKey,
    KeySpec,
    TenantSpec,
    TenantUpdate,
    TenantView,
    validate_quota,
)

JsonObject = dict[str, Any]

QUOTA_FIELDS = (
    "tokens_per_minute",
    "requests_per_minute",
    "tokens_per_day",
    "max_concurrent",
    "max_prompt_tokens",
    "max_output_tokens",
    "models",
    "ttft_slo_ms",
    "tpot_slo_ms",
    "default_max_tokens_reservation",
)
_TENANT_FIELDS = ("name", "priority", "weight", "cache_scope", "share_cache_scope_with", "quota")
_UPDATE_FIELDS = ("priority", "weight", "cache_scope", "share_cache_scope_with", "status")
_KEY_FIELDS = ("scopes", "expires_at")


# -- parsing -------------------------------------------------------------------------------------


def parse_object(body: object, allowed: Sequence[str], where: str) -> Mapping[str, Any]:
    """A JSON object with only `allowed` fields; `where` names it in errors (`body` at the top)."""
    if not isinstance(body, Mapping):
        raise FieldError(where, "must be a JSON object")
    for name in body:
        if name not in allowed:
            prefix = "" if where == "body" else where + "."
            raise FieldError(f"{prefix}{name}", f"unknown field; expected one of {', '.join(allowed)}")
    return body


def parse_priority(value: object, field: str = "priority") -> Priority:
    """`interactive`, `standard` or `batch` (the names in workloads/tenants.json)."""
    if isinstance(value, str) and value.upper() in Priority.__members__:
        return Priority[value.upper()]
    raise FieldError(field, "must be one of interactive, standard, batch")


def parse_status(value: object, field: str = "status") -> TenantStatus:
    """`active` or `suspended`."""
    if isinstance(value, str) and value in TenantStatus._value2member_map_:
        return TenantStatus(value)
    raise FieldError(field, "must be one of active, suspended")


def _number(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(field, "must be a number")
    return float(value)


def parse_optional_int(value: object, field: str) -> int | None:
    """An integer or null (an integral float such as 1e6 counts: JSON has one number type)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type; 1e6 is an integer
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, "must be an integer or null")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise FieldError(field, "must be a string")
    return value


def _optional_string(data: Mapping[str, Any], field: str) -> str | None:
    value = data.get(field)
    return _string(value, field) if value is not None else None


def parse_quota(body: object, where: str = "quota") -> QuotaLimits:
    """A quota object; absent or null fields mean unlimited, `models` absent means every model."""
    data = parse_object(body, QUOTA_FIELDS, where)
    prefix = "" if where == "body" else where + "."
    models = data.get("models", [])
    if models is None:
        models = []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise FieldError(f"{prefix}models", "must be a list of model names")

    def limit(name: str) -> int | None:
        return parse_optional_int(data.get(name), prefix + name)

    quota = QuotaLimits(
        tokens_per_minute=limit("tokens_per_minute"),
        requests_per_minute=limit("requests_per_minute"),
        tokens_per_day=limit("tokens_per_day"),
        max_concurrent=limit("max_concurrent"),
        max_prompt_tokens=limit("max_prompt_tokens"),
        max_output_tokens=limit("max_output_tokens"),
        models=tuple(models),
        ttft_slo_ms=limit("ttft_slo_ms"),
        tpot_slo_ms=limit("tpot_slo_ms"),
        default_max_tokens_reservation=limit("default_max_tokens_reservation"),
    )
    return validate_quota(quota, prefix)


def parse_tenant_spec(body: object) -> TenantSpec:
    """`{"name", "priority", "weight", "cache_scope" | "share_cache_scope_with", "quota": {...}}`.

    Only `name` is required.
    """
    data = parse_object(body, _TENANT_FIELDS, "body")
    if "name" not in data:
        raise FieldError("name", "is required")
    cache_scope = data.get("cache_scope")
    return TenantSpec(
        name=_string(data["name"], "name"),
        priority=parse_priority(data["priority"]) if data.get("priority") is not None else Priority.STANDARD,
        weight=_number(data["weight"], "weight") if data.get("weight") is not None else 1.0,
        cache_scope=_string(cache_scope, "cache_scope") if cache_scope is not None else None,
        quota=parse_quota(data["quota"]) if data.get("quota") is not None else QuotaLimits(),
        share_cache_scope_with=_optional_string(data, "share_cache_scope_with"),
    )


def parse_tenant_update(body: object) -> TenantUpdate:
    """A partial update: any of `priority`, `weight`, `cache_scope`, `share_cache_scope_with`, `status`."""
    data = parse_object(body, _UPDATE_FIELDS, "body")
    return TenantUpdate(
        priority=parse_priority(data["priority"]) if data.get("priority") is not None else None,
        weight=_number(data["weight"], "weight") if data.get("weight") is not None else None,
        cache_scope=_string(data["cache_scope"], "cache_scope")
        if data.get("cache_scope") is not None
        else None,
        status=parse_status(data["status"]) if data.get("status") is not None else None,
        share_cache_scope_with=_optional_string(data, "share_cache_scope_with"),
    )


def parse_datetime(value: object, field: str) -> dt.datetime:
    """An ISO 8601 time with a zone (`Z` or an offset)."""
    if not isinstance(value, str):
        raise FieldError(field, "must be an ISO 8601 time string")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise FieldError(field, "must be an ISO 8601 time, e.g. 2030-01-01T00:00:00Z") from None
    if parsed.tzinfo is None:
        raise FieldError(field, "must include a time zone (e.g. a trailing Z)")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise FieldError(field, "must be a time between years 1 and 9999 in UTC") from None


def parse_date(value: object, field: str) -> dt.date:
    """An ISO date, `YYYY-MM-DD`."""
    if not isinstance(value, str):
        raise FieldError(field, "must be a date, YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise FieldError(field, "must be a date, YYYY-MM-DD") from None


def parse_key_spec(body: object) -> KeySpec:
    """`{"scopes": [...], "expires_at": "..."}`, both optional (all scopes, no expiry)."""
    data = parse_object(body if body is not None else {}, _KEY_FIELDS, "body")
    raw_scopes = data.get("scopes")
    if raw_scopes is None:
        scopes = tuple(KeyScope)
    else:
        if not isinstance(raw_scopes, list):
            raise FieldError("scopes", "must be a list")
        try:
            scopes = tuple(KeyScope(s) for s in raw_scopes)
        except ValueError:
            raise FieldError(
                "scopes", f"each scope must be one of {', '.join(s.value for s in KeyScope)}"
            ) from None
    expires = data.get("expires_at")
    return KeySpec(
        scopes=scopes, expires_at=parse_datetime(expires, "expires_at") if expires is not None else None
    )


# -- rendering -----------------------------------------------------------------------------------


def time_json(value: dt.datetime | None) -> str | None:
    """A time as the admin API writes it: ISO 8601 in UTC with a trailing Z."""
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def quota_json(quota: QuotaLimits) -> JsonObject:
    """The quota object, every field present (null: unlimited)."""
    return quota.as_dict()


def tenant_json(tenant: TenantView) -> JsonObject:
    """A tenant as the admin API shows it."""
    return {
        "object": "tenant",
        "name": tenant.name,
        "status": tenant.status.value,
        "priority": tenant.priority.name.lower(),
        "weight": tenant.weight,
        "cache_scope": tenant.cache_scope,
        "quota": quota_json(tenant.quota),
        "created_at": time_json(tenant.created_at),
        "updated_at": time_json(tenant.updated_at),
    }


def key_json(key: ApiKeyView, now: dt.datetime) -> JsonObject:
    """A key's metadata (never the secret)."""
    return {
        "object": "api_key",
        "id": key.id,
        "prefix": key.prefix,
        "tenant": key.tenant,
        "scopes": [s.value for s in key.scopes],
        "state": key.state(now).value,
        "created_at": time_json(key.created_at),
        "expires_at": time_json(key.expires_at),
        "revoked_at": time_json(key.revoked_at),
        "last_used_at": time_json(key.last_used_at),
        "limits": key_limits_dict(key.limits),
    }


def issued_key_json(issued: IssuedKey, now: dt.datetime) -> JsonObject:
    """A new key with its secret: `{"id", "key", ...}`. The only response that carries a secret."""
    body = key_json(issued.view, now)
    body["key"] = issued.key
    return body


def usage_json(tenant: str, days: Sequence[DailyUsage]) -> JsonObject:
    """A tenant's usage per UTC day plus the total over the days shown."""

    def row(d: DailyUsage) -> JsonObject:
        return {
            "requests": d.num_requests,
            "completed": d.num_completed,
            "failed": d.num_failed,
            "cancelled": d.num_cancelled,
            "prompt_tokens": d.prompt_tokens,
            "completion_tokens": d.completion_tokens,
            "cached_tokens": d.cached_tokens,
            "total_tokens": d.total_tokens,
        }

    total = DailyUsage(
        day=dt.date.min,
        num_requests=sum(d.num_requests for d in days),
        num_completed=sum(d.num_completed for d in days),
        num_failed=sum(d.num_failed for d in days),
        num_cancelled=sum(d.num_cancelled for d in days),
        prompt_tokens=sum(d.prompt_tokens for d in days),
        completion_tokens=sum(d.completion_tokens for d in days),
        cached_tokens=sum(d.cached_tokens for d in days),
    )
    return {
        "object": "usage",
        "tenant": tenant,
        "data": [{"day": d.day.isoformat(), **row(d)} for d in days],
        "total": row(total),
    }


def audit_json(event: AuditEventView) -> JsonObject:
    """One audit event."""
    return {
        "object": "audit_event",
        "id": event.id,
        "created_at": time_json(event.created_at),
        "actor": event.actor,
        "action": event.action.value,
        "tenant": event.tenant,
        "target": event.target,
        "details": event.details,
    }


def list_json(items: Sequence[JsonObject]) -> JsonObject:
    """An OpenAI-style list envelope."""
    return {"object": "list", "data": list(items)}


def tenant_spec_json(spec: TenantSpec) -> JsonObject:
    """The request body of POST /admin/v1/tenants for this spec."""
    body: JsonObject = {
        "name": spec.name,
        "priority": spec.priority.name.lower(),
        "weight": spec.weight,
        "quota": quota_json(spec.quota),
    }
    if spec.cache_scope is not None:
        body["cache_scope"] = spec.cache_scope
    if spec.share_cache_scope_with is not None:
        body["share_cache_scope_with"] = spec.share_cache_scope_with
    return body


def tenant_update_json(change: TenantUpdate) -> JsonObject:
    """The request body of PATCH /admin/v1/tenants/{name} for this change."""
    body: JsonObject = {}
    if change.priority is not None:
        body["priority"] = change.priority.name.lower()
    if change.weight is not None:
        body["weight"] = change.weight
    if change.cache_scope is not None:
        body["cache_scope"] = change.cache_scope
    if change.share_cache_scope_with is not None:
        body["share_cache_scope_with"] = change.share_cache_scope_with
    if change.status is not None:
        body["status"] = change.status.value
    return body


def key_spec_json(spec: KeySpec) -> JsonObject:
    """The request body of POST /admin/v1/tenants/{name}/keys for this spec."""
    return {"scopes": [s.value for s in spec.scopes], "expires_at": time_json(spec.expires_at)}
