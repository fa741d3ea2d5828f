"""The admin operations of `/openapi.json`: /admin/v1 (tenants, keys, quotas, usage, audit), the
model versions and their rollouts, the prefix-cache admin API, and the tenant's own /v1/usage.

Enums, field lists and name patterns come from the tenancy module that validates them
(`tenancy.admin_codec`, `tenancy.records`, `tenancy.keys`), so the document cannot drift from them.
"""

from __future__ import annotations

from typing import Any

from engine.config import ENGINE_DTYPES
from engine.request import Priority
from gateway.adapter_admin_bodies import openapi_schemas as adapter_schemas
from tenancy.admin_codec import _TENANT_FIELDS, _UPDATE_FIELDS, QUOTA_FIELDS
from tenancy.enums import KeyScope, TenantStatus
from tenancy.key_limits_api import key_limits_schema
from tenancy.keys import _PUBLIC_ID_RE
from tenancy.model_version_records import _NAME_RE as _MODEL_NAME_RE
from tenancy.model_version_records import _VERSION_RE, MAX_KV_CACHE_TOKENS, MAX_PATH_LEN
from tenancy.records import _MAX_INT32, _MAX_INT64, _MAX_WEIGHT, _NAME_RE, _SCOPE_RE
from tenancy.usage_report import DEFAULT_GROUP_BY, DEFAULT_LIMIT, FORMATS, GROUPS, MAX_LIMIT

ADMIN: list[dict[str, list[str]]] = [{"admin_token": []}]
MAX_QUERY_INT = 2**63 - 1

_PRIORITY = {"type": "string", "enum": [p.name.lower() for p in Priority]}
_TENANT_NAME = {"type": "string", "pattern": f"^{_NAME_RE.pattern}$"}
_CACHE_SCOPE = {"type": "string", "pattern": f"^{_SCOPE_RE.pattern}$"}
_SHARE_CACHE_SCOPE_WITH = {
    **_TENANT_NAME,
    "description": "Join this existing tenant's cache scope on purpose (audited); not with cache_scope. "
    "A cache_scope that is another tenant's scope or name is refused (409 cache_scope_conflict).",
}
_WEIGHT = {"type": "number", "exclusiveMinimum": 0, "maximum": _MAX_WEIGHT}
_DATE = {"type": "string", "format": "date"}
_OBJECT = {"type": "object"}

_LIMIT_MAX = {
    "requests_per_minute": _MAX_INT64,
    "tokens_per_minute": _MAX_INT64,
    "tokens_per_day": _MAX_INT64,
}


def _quota_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name in QUOTA_FIELDS:
        if name == "models":
            properties[name] = {
                "type": ["array", "null"],
                "items": {"type": "string", "minLength": 1, "maxLength": 256},
                "uniqueItems": True,
            }
        else:
            maximum = _LIMIT_MAX.get(name, _MAX_INT32)
            properties[name] = {"type": ["integer", "null"], "minimum": 1, "maximum": maximum}
    return {"type": "object", "additionalProperties": False, "properties": properties}


# The fields tenancy.admin_codec accepts; one it adds later is documented as a plain string until
# described here.
_TEXT = {"type": "string"}
_TENANT_PROPERTIES: dict[str, Any] = {
    "name": _TENANT_NAME,
    "priority": _PRIORITY,
    "weight": _WEIGHT,
    "cache_scope": _CACHE_SCOPE,
    "share_cache_scope_with": {**_TENANT_NAME, "description": "Join this tenant's cache scope (audited)."},
    "quota": {"$ref": "#/components/schemas/Quota"},
    "status": {"type": "string", "enum": [s.value for s in TenantStatus]},
}

SCHEMAS: dict[str, Any] = {
    **adapter_schemas(),
    "Quota": _quota_schema(),
    "KeyLimits": key_limits_schema(),
    "TenantCreate": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {name: _TENANT_PROPERTIES.get(name, _TEXT) for name in _TENANT_FIELDS},
    },
    "TenantUpdate": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {name: _TENANT_PROPERTIES.get(name, _TEXT) for name in _UPDATE_FIELDS},
    },
    "KeyCreate": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "scopes": {
                "type": "array",
                "items": {"type": "string", "enum": [s.value for s in KeyScope]},
                "minItems": 1,
                "uniqueItems": True,
            },
            "expires_at": {"type": "string", "format": "date-time", "description": "In the future."},
        },
    },
    "PrefixRegister": {
        "type": "object",
        "additionalProperties": False,
        "description": "Exactly one of token_ids, text, messages.",
        "properties": {
            "token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            "text": {"type": "string", "minLength": 1},
            "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
            "add_special_tokens": {"type": "boolean"},
            "name": {"type": "string", "minLength": 1},
            "pin": {"type": "boolean"},
        },
    },
    "ModelVersionCreate": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "version", "path"],
        "properties": {
            "name": {"type": "string", "pattern": f"^{_MODEL_NAME_RE.pattern}$"},
            "version": {"type": "string", "pattern": f"^{_VERSION_RE.pattern}$"},
            "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_LEN},
            "tokenizer": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_PATH_LEN},
            "dtype": {"type": ["string", "null"], "enum": [*ENGINE_DTYPES, None]},
            "kv_cache_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_KV_CACHE_TOKENS},
        },
    },
    "ModelTraffic": {
        "type": "object",
        "additionalProperties": False,
        "description": "The whole plan: split percents sum to 100 (or empty); pins send a tenant to one "
        "version. Every version with a share or a pin must be ready (409 otherwise).",
        "properties": {
            "split": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "pins": {
                "type": "object",
                "additionalProperties": {"type": "string", "pattern": f"^{_VERSION_RE.pattern}$"},
            },
        },
    },
    "ModelRollback": {
        "type": "object",
        "additionalProperties": False,
        "required": ["to"],
        "properties": {"to": {"type": "string", "pattern": f"^{_VERSION_RE.pattern}$"}},
    },
    "PrefixFlush": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "model_version": {"type": "string", "minLength": 1},
            "tenant": {"type": "string", "minLength": 1},
            "cache_scope": {"type": "string", "minLength": 1},
            "include_pinned": {"type": "boolean"},
        },
    },
}


def _path(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


_TENANT = _path("name", _TENANT_NAME)
_KEY_ID = _path("key_id", {"type": "string", "pattern": f"^{_PUBLIC_ID_RE.pattern}$"})
_PREFIX_ID = _path("prefix_id", {"type": "string", "minLength": 1})
_MODEL = _path("name", {"type": "string", "pattern": f"^{_MODEL_NAME_RE.pattern}$"})
_VERSION = _path("version", {"type": "string", "pattern": f"^{_VERSION_RE.pattern}$"})
# Which loaded version a prefix-cache call acts on; default: the default model's serving version.
_SELECT = [_query("model", {"type": "string"}), _query("version", {"type": "string"})]
_SINCE_UNTIL = [_query("since", _DATE), _query("until", _DATE)]


def _op(
    summary: str,
    errors: dict[str, Any],
    *,
    ok: str = "200",
    body: str | None = None,
    parameters: list[dict[str, Any]] | None = None,
    security: list[dict[str, list[str]]] = ADMIN,
) -> dict[str, Any]:
    codes = ("400", "401", "403", "404", "409", "413", "422", "429", "503")
    op: dict[str, Any] = {
        "summary": summary,
        "security": security,
        "responses": {
            ok: {"description": "OK", "content": {"application/json": {"schema": _OBJECT}}},
            **{c: errors[c] for c in codes},
        },
    }
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


_TIME = {
    "type": "string",
    "description": "YYYY-MM-DD (midnight UTC) or an ISO 8601 time with a zone",
    "examples": ["2026-03-01", "2026-03-01T12:00:00Z"],
}


def _usage_report_op(errors: dict[str, Any]) -> dict[str, Any]:
    group_by = {
        "type": "string",
        "pattern": f"^({'|'.join(GROUPS)})(,({'|'.join(GROUPS)}))*$",
        "default": ",".join(DEFAULT_GROUP_BY),
        "description": "Comma-separated dimensions, each at most once.",
    }
    op = _op(
        "Usage over [since, until) grouped by tenant, key, model, model_version, user, adapter, day or "
        "hour (UTC), one page of groups, with the whole range's exact totals; JSON or CSV",
        errors,
        parameters=[
            {"name": "since", "in": "query", "required": True, "schema": _TIME},
            {
                "name": "until",
                "in": "query",
                "required": True,
                "schema": {**_TIME, "description": "exclusive"},
            },
            _query("group_by", group_by),
            _query("tenant", _TENANT_NAME),
            _query("key_id", {"type": "string", "pattern": f"^{_PUBLIC_ID_RE.pattern}$"}),
            _query(
                "limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}
            ),
            _query("offset", {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT, "default": 0}),
            _query("format", {"type": "string", "enum": list(FORMATS), "default": "json"}),
        ],
    )
    op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}
    return op


def admin_paths(errors: dict[str, Any]) -> dict[str, Any]:
    """The admin paths; `errors` maps status codes to the shared error responses."""
    e = errors
    paths: dict[str, Any] = {
        "/admin/v1/tenants": {
            "get": _op("List tenants", e),
            "post": _op("Create a tenant", e, ok="201", body="TenantCreate"),
        },
        "/admin/v1/tenants/{name}": {
            "get": _op("One tenant", e, parameters=[_TENANT]),
            "patch": _op("Update a tenant", e, body="TenantUpdate", parameters=[_TENANT]),
        },
        "/admin/v1/tenants/{name}/suspend": {"post": _op("Suspend a tenant", e, parameters=[_TENANT])},
        "/admin/v1/tenants/{name}/quota": {
            "put": _op("Replace a tenant's quota", e, body="Quota", parameters=[_TENANT])
        },
        "/admin/v1/tenants/{name}/keys": {
            "get": _op("A tenant's API keys (never the secrets)", e, parameters=[_TENANT]),
            "post": _op(
                "Issue an API key (the secret is shown once)",
                e,
                ok="201",
                body="KeyCreate",
                parameters=[_TENANT],
            ),
        },  # fmt: skip
        "/admin/v1/tenants/{name}/usage": {
            "get": _op("A tenant's usage per UTC day", e, parameters=[_TENANT, *_SINCE_UNTIL])
        },
        "/admin/v1/usage/report": {"get": _usage_report_op(e)},
        "/admin/v1/keys/{key_id}": {
            "get": _op("One key, with its own limits (never the secret)", e, parameters=[_KEY_ID]),
            "delete": _op("Revoke a key", e, parameters=[_KEY_ID]),
        },
        "/admin/v1/keys/{key_id}/limits": {
            "put": _op(
                "Replace a key's own limits, nested in its tenant's (the tighter applies)",
                e,
                body="KeyLimits",
                parameters=[_KEY_ID],
            )
        },
        "/admin/v1/keys/{key_id}/rotate": {
            "post": _op("Rotate a key: a new secret, the old one revoked", e, ok="201", parameters=[_KEY_ID])
        },
        "/admin/v1/audit": {
            "get": _op(
                "Audit events, newest first",
                e,
                parameters=[
                    _query("tenant", {"type": "string"}),
                    _query("limit", {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT}),
                    _query("before", {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT}),
                ],
            )
        },
        "/v1/usage": {
            "get": _op(
                "The calling tenant's own usage (API key with the usage scope)",
                e,
                parameters=[_query("tenant", {"type": "string"}), *_SINCE_UNTIL],
                security=[{"bearer": []}],
            )
        },
    }
    models = "/admin/v1/models"
    version = f"{models}/{{name}}/versions/{{version}}"
    paths |= {
        models: {
            "get": _op("Every model version: state, traffic share, pins, in flight, KV use; every plan", e),
            "post": _op("Register a model version", e, ok="201", body="ModelVersionCreate"),
        },
        f"{version}/load": {
            "post": _op("Load and warm up (ready), or 422 with the reason (failed)", e, parameters=[_MODEL, _VERSION])
        },
        f"{version}/drain": {"post": _op("No new requests; in-flight ones finish", e, parameters=[_MODEL, _VERSION])},
        f"{version}/retire": {
            "post": _op("After the drain: unload, free its memory and cached blocks", e, parameters=[_MODEL, _VERSION])
        },
        f"{models}/{{name}}/traffic": {
            "put": _op("Replace the split and pins", e, body="ModelTraffic", parameters=[_MODEL])
        },
        f"{models}/{{name}}/rollback": {
            "post": _op("All traffic back to one version; the others drain", e, body="ModelRollback", parameters=[_MODEL])
        },
    }  # fmt: skip
    adapters, adapter = "/admin/v1/adapters", [_path("name", {"type": "string", "minLength": 1})]
    paths |= {
        adapters: {
            "get": _op("Every LoRA adapter: record, access, runtime", e, parameters=[_query("model_version", {"type": "string"})]),
            "post": _op("Register a LoRA adapter of a base model version", e, ok="201", body="AdapterRegister"),
        },
        f"{adapters}/{{name}}": {"get": _op("One LoRA adapter", e, parameters=adapter)},
        f"{adapters}/{{name}}/load": {"post": _op("Load it on its base version's engine; 400 if refused", e, parameters=adapter)},
        f"{adapters}/{{name}}/unload": {"post": _op("Stop routing, let its requests finish, free it", e, parameters=adapter)},
        f"{adapters}/{{name}}/retire": {"post": _op("Unload if loaded; never loaded again", e, parameters=adapter)},
        f"{adapters}/{{name}}/grant": {"post": _op("Add a tenant to its access list", e, body="AdapterAccess", parameters=adapter)},
        f"{adapters}/{{name}}/revoke": {"post": _op("Remove a tenant from its access list", e, body="AdapterAccess", parameters=adapter)},
    }  # fmt: skip
    base = "/admin/v1/prefix-cache"
    paths |= {
        f"{base}/stats": {"get": _op("Prefix cache totals, per tenant, per scope", e, parameters=_SELECT)},
        f"{base}/tenants/{{name}}": {
            "get": _op("One tenant's prefix-cache figures", e, parameters=[_path("name", {"type": "string"}), *_SELECT])
        },
        f"{base}/prefixes": {
            "get": _op("Registered shared prefixes", e, parameters=_SELECT),
            "post": _op("Register (and compute) a shared prefix", e, ok="201", body="PrefixRegister", parameters=_SELECT),
        },
        f"{base}/prefixes/{{prefix_id}}": {
            "get": _op("One shared prefix", e, parameters=[_PREFIX_ID, *_SELECT]),
            "delete": _op("Unregister a shared prefix", e, parameters=[_PREFIX_ID, *_SELECT]),
        },
        f"{base}/prefixes/{{prefix_id}}/pin": {"post": _op("Never evict it", e, parameters=[_PREFIX_ID, *_SELECT])},
        f"{base}/prefixes/{{prefix_id}}/unpin": {"post": _op("Evictable again", e, parameters=[_PREFIX_ID, *_SELECT])},
        f"{base}/flush": {"post": _op("Drop cached blocks", e, body="PrefixFlush", parameters=_SELECT)},
    }  # fmt: skip
    return paths
