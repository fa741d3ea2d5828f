"""The admin operations of `/openapi.json`: /admin/v1 (tenants, keys, quotas, usage, audit), the
model versions and their rollouts, the prefix-cache admin API, and the tenant's own /v1/usage.

Every request and response body is generated from the pydantic models the routes parse and
render with (`weir.tenancy.admin_bodies`, `weir.gateway.api.prefix_cache_bodies`), so the document cannot
drift from them; `tests/gateway/api/test_openapi_admin.py` validates a real answer of every route
against it. Only the operations (paths, parameters, summaries) are listed here.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from weir.gateway.api.adapter_admin_bodies import (
    AdapterAccessBody,
    AdapterListOut,
    AdapterOut,
    AdapterRegisterBody,
)
from weir.gateway.api.prefix_cache_bodies import (
    PrefixCacheFlush,
    PrefixCacheStatsBody,
    PrefixFlushBody,
    PrefixList,
    PrefixRegisterBody,
    SharedPrefix,
    TenantCacheStatsBody,
)
from weir.tenancy.admin_bodies.audit import AuditList
from weir.tenancy.admin_bodies.fields import MAX_QUERY_LEN, KeyId, ModelName, TenantName, VersionLabel
from weir.tenancy.admin_bodies.keys import ApiKey, ApiKeyList, IssuedApiKey, KeyCreate
from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionCreate,
    ModelVersionList,
    Rollback,
    TrafficBody,
    TrafficPlanBody,
    VersionAction,
)
from weir.tenancy.admin_bodies.quota import KeyLimitsBody
from weir.tenancy.admin_bodies.spend_api import (
    BudgetBody,
    BudgetList,
    BudgetOut,
    PriceBody,
    PriceList,
    PriceOut,
)
from weir.tenancy.admin_bodies.stored_responses import StoredResponsesView
from weir.tenancy.admin_bodies.tenants import Tenant, TenantCreate, TenantList, TenantPatch
from weir.tenancy.admin_bodies.usage import TenantUsage, UsageReportBody
from weir.tenancy.admin_bodies.usage_query import AuditQuery, ReportParams, UsageQuery
from weir.tenancy.quota_limits import QuotaLimits

ADMIN: list[dict[str, list[str]]] = [{"admin_token": []}]

# Request bodies by the name the paths use, then the answers (serialization mode: what is sent).
_REQUESTS: dict[str, Any] = {
    "TenantCreate": TenantCreate,
    "TenantPatch": TenantPatch,
    "QuotaLimits": QuotaLimits,
    "KeyCreate": KeyCreate,
    "KeyLimits": KeyLimitsBody,
    "ModelVersionCreate": ModelVersionCreate,
    "TrafficBody": TrafficBody,
    "Rollback": Rollback,
    "VersionAction": VersionAction,
    "PrefixRegister": PrefixRegisterBody,
    "PrefixFlush": PrefixFlushBody,
    "PriceBody": PriceBody,
    "BudgetBody": BudgetBody,
    "AdapterRegister": AdapterRegisterBody,
    "AdapterAccess": AdapterAccessBody,
}
_ANSWERS: dict[str, Any] = {
    "Tenant": Tenant,
    "TenantList": TenantList,
    "ApiKey": ApiKey,
    "IssuedApiKey": IssuedApiKey,
    "ApiKeyList": ApiKeyList,
    "TenantUsage": TenantUsage,
    "StoredResponses": StoredResponsesView,
    "UsageReport": UsageReportBody,
    "AuditList": AuditList,
    "ModelVersion": ModelVersion,
    "ModelVersionList": ModelVersionList,
    "TrafficPlan": TrafficPlanBody,
    "PrefixCacheStats": PrefixCacheStatsBody,
    "TenantCacheStats": TenantCacheStatsBody,
    "SharedPrefix": SharedPrefix,
    "PrefixList": PrefixList,
    "PrefixCacheFlush": PrefixCacheFlush,
    "Price": PriceOut,
    "PriceList": PriceList,
    "Budget": BudgetOut,
    "BudgetList": BudgetList,
    "Adapter": AdapterOut,
    "AdapterList": AdapterListOut,
}
_REF = "#/components/schemas/{model}"


def _generate() -> tuple[dict[str, Any], dict[str, Any]]:
    """Every body's schema (a `$ref` into components) by name, and the components themselves."""
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]] = [
        *((name, "validation", TypeAdapter(t)) for name, t in _REQUESTS.items()),
        *((name, "serialization", TypeAdapter(t)) for name, t in _ANSWERS.items()),
    ]
    by_key, defs = TypeAdapter.json_schemas(inputs, ref_template=_REF)
    return {name: schema for (name, _mode), schema in by_key.items()}, dict(defs.get("$defs", {}))


BODIES, SCHEMAS = _generate()


def _schema(t: Any) -> dict[str, Any]:
    """An inline schema of a scalar type (a path or query parameter)."""
    return TypeAdapter(t).json_schema()


def _path(name: str, t: Any) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _schema(t)}


def _query_params(model: Any) -> list[dict[str, Any]]:
    """The query parameters of a query model, one per field."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema["properties"].items()
    ]


def _query(name: str, t: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": _schema(t)}


def _filter(name: str) -> dict[str, Any]:
    """An optional filter the routes read with `bounded_query`: 1-MAX_QUERY_LEN characters."""
    schema = {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_LEN}
    return {"name": name, "in": "query", "required": False, "schema": schema}


_TENANT = _path("name", TenantName)
_KEY_ID = _path("key_id", KeyId)
_PREFIX_ID = _path("prefix_id", str)
_MODEL = _path("name", ModelName)
_VERSION = _path("version", VersionLabel)
# Which loaded version a prefix-cache call acts on; default: the default model's serving version.
_SELECT = [_query("model", str), _query("version", str)]


def _op(
    summary: str,
    errors: dict[str, Any],
    answer: str,
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
            ok: {"description": "OK", "content": {"application/json": {"schema": BODIES[answer]}}},
            **{c: errors[c] for c in codes},
        },
    }
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": False, "content": {"application/json": {"schema": BODIES[body]}}}
    return op


def _usage_report_op(errors: dict[str, Any]) -> dict[str, Any]:
    op = _op(
        "Usage over [since, until) grouped by tenant, key, model, model_version, user, adapter, day or "
        "hour (UTC), one page of groups, with the whole range's exact totals; JSON or CSV",
        errors,
        "UsageReport",
        parameters=_query_params(ReportParams),
    )
    op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}
    return op


def _tenancy_paths(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "/admin/v1/tenants": {
            "get": _op("List tenants", e, "TenantList"),
            "post": _op("Create a tenant", e, "Tenant", ok="201", body="TenantCreate"),
        },
        "/admin/v1/tenants/{name}": {
            "get": _op("One tenant", e, "Tenant", parameters=[_TENANT]),
            "patch": _op("Update a tenant", e, "Tenant", body="TenantPatch", parameters=[_TENANT]),
        },
        "/admin/v1/tenants/{name}/suspend": {
            "post": _op("Suspend a tenant", e, "Tenant", parameters=[_TENANT])
        },
        "/admin/v1/tenants/{name}/quota": {
            "put": _op("Replace a tenant's quota", e, "Tenant", body="QuotaLimits", parameters=[_TENANT])
        },
        "/admin/v1/tenants/{name}/keys": {
            "get": _op("A tenant's API keys (never the secrets)", e, "ApiKeyList", parameters=[_TENANT]),
            "post": _op(
                "Issue an API key (the secret is shown once)",
                e,
                "IssuedApiKey",
                ok="201",
                body="KeyCreate",
                parameters=[_TENANT],
            ),
        },  # fmt: skip
        "/admin/v1/tenants/{name}/usage": {
            "get": _op(
                "A tenant's usage per UTC day",
                e,
                "TenantUsage",
                parameters=[_TENANT, *_query_params(UsageQuery)],
            )
        },  # fmt: skip
        "/admin/v1/tenants/{name}/stored-responses": {
            "get": _op(
                "A tenant's stored /v1/responses: bytes held against the storage quota, retention",
                e,
                "StoredResponses",
                parameters=[_TENANT],
            )
        },  # fmt: skip
        "/admin/v1/usage/report": {"get": _usage_report_op(e)},
        "/admin/v1/keys/{key_id}": {
            "get": _op("One key, with its own limits (never the secret)", e, "ApiKey", parameters=[_KEY_ID]),
            "delete": _op("Revoke a key", e, "ApiKey", parameters=[_KEY_ID]),
        },
        "/admin/v1/keys/{key_id}/limits": {
            "put": _op(
                "Replace a key's own limits, nested in its tenant's (the tighter applies)",
                e,
                "ApiKey",
                body="KeyLimits",
                parameters=[_KEY_ID],
            )
        },  # fmt: skip
        "/admin/v1/keys/{key_id}/rotate": {
            "post": _op(
                "Rotate a key: a new secret, the old one revoked",
                e,
                "IssuedApiKey",
                ok="201",
                parameters=[_KEY_ID],
            )
        },  # fmt: skip
        "/admin/v1/audit": {
            "get": _op("Audit events, newest first", e, "AuditList", parameters=_query_params(AuditQuery))
        },
        "/v1/usage": {
            "get": _op(
                "The calling tenant's own usage (API key with the usage scope)",
                e,
                "TenantUsage",
                parameters=[_query("tenant", str), *_query_params(UsageQuery)],
                security=[{"bearer": []}],
            )
        },  # fmt: skip
    }


def _model_paths(e: dict[str, Any]) -> dict[str, Any]:
    models = "/admin/v1/models"
    version = f"{models}/{{name}}/versions/{{version}}"
    mv = [_MODEL, _VERSION]
    # Refused with 409 last_serving_version for the model's last ready version, unless forced.
    forced = [*mv, {"name": "force", "in": "query", "required": False,
                    "schema": {"type": "string", "enum": ["true", "false"]}}]  # fmt: skip
    return {
        models: {
            "get": _op("Every model version: state, traffic share, pins, in flight, KV use; every plan", e,
                       "ModelVersionList"),
            "post": _op("Register a model version", e, "ModelVersion", ok="201", body="ModelVersionCreate"),
        },
        f"{version}/load": {
            "post": _op("Load and warm up (ready), or 422 with the reason (failed)", e, "ModelVersion", parameters=mv)
        },
        f"{version}/drain": {
            "post": _op("No new requests; in-flight ones finish (the model's last ready version: 409 unless "
                        "forced)", e, "ModelVersion", body="VersionAction", parameters=forced)
        },
        f"{version}/retire": {
            "post": _op("After the drain: unload, free its memory and cached blocks; it leaves the split (the "
                        "model's last version: 409 unless forced)", e, "ModelVersion", body="VersionAction",
                        parameters=forced)
        },
        f"{models}/{{name}}/traffic": {
            "put": _op("Replace the split and pins", e, "TrafficPlan", body="TrafficBody", parameters=[_MODEL])
        },
        f"{models}/{{name}}/rollback": {
            "post": _op("All traffic back to one version; the others drain", e, "TrafficPlan", body="Rollback",
                        parameters=[_MODEL])
        },
    }  # fmt: skip


def _prefix_cache_paths(e: dict[str, Any]) -> dict[str, Any]:
    base = "/admin/v1/prefix-cache"
    one = [_PREFIX_ID, *_SELECT]
    return {
        f"{base}/stats": {"get": _op("Prefix cache totals, per tenant, per scope", e, "PrefixCacheStats", parameters=_SELECT)},
        f"{base}/tenants/{{name}}": {
            "get": _op("One tenant's prefix-cache figures", e, "TenantCacheStats",
                       parameters=[_path("name", str), *_SELECT])
        },
        f"{base}/prefixes": {
            "get": _op("Registered shared prefixes", e, "PrefixList", parameters=_SELECT),
            "post": _op("Register (and compute) a shared prefix", e, "SharedPrefix", ok="201", body="PrefixRegister",
                        parameters=_SELECT),
        },
        f"{base}/prefixes/{{prefix_id}}": {
            "get": _op("One shared prefix", e, "SharedPrefix", parameters=one),
            "delete": _op("Unregister a shared prefix", e, "SharedPrefix", parameters=one),
        },
        f"{base}/prefixes/{{prefix_id}}/pin": {"post": _op("Never evict it", e, "SharedPrefix", parameters=one)},
        f"{base}/prefixes/{{prefix_id}}/unpin": {"post": _op("Evictable again", e, "SharedPrefix", parameters=one)},
        f"{base}/flush": {"post": _op("Drop cached blocks", e, "PrefixCacheFlush", body="PrefixFlush", parameters=_SELECT)},
    }  # fmt: skip


def _spend_paths(e: dict[str, Any]) -> dict[str, Any]:
    """Prices and window budgets (gateway/routes/spend_admin.py)."""
    return {
        "/admin/v1/prices": {
            "get": _op("The price table, oldest first per model", e, "PriceList", parameters=[_filter("model")]),
            "post": _op("Add a price of a model version or model, effective now or later (audited; recorded "
                        "spend is never rewritten)", e, "Price", ok="201", body="PriceBody"),
        },
        "/admin/v1/budgets": {
            "get": _op("Token and money budgets over windows, with the current window's count and reset", e,
                       "BudgetList", parameters=[_filter("tenant")]),
            "put": _op("Set a tenant's or key's budget over a window (soft: alert; hard: 429)", e, "Budget",
                       body="BudgetBody"),
        },
        "/admin/v1/budgets/{budget_id}": {
            "delete": _op("Remove a budget", e, "Budget", parameters=[_path("budget_id", int)])
        },
    }  # fmt: skip


def _adapter_paths(e: dict[str, Any]) -> dict[str, Any]:
    """LoRA adapters (gateway/routes/adapters_admin.py), mounted only with a fleet that serves them."""
    adapters, one = "/admin/v1/adapters", [_path("name", str)]
    return {
        adapters: {
            "get": _op("Every LoRA adapter: record, access, runtime", e, "AdapterList",
                       parameters=[_filter("model_version")]),
            "post": _op("Register a LoRA adapter of a base model version", e, "Adapter", ok="201",
                        body="AdapterRegister"),
        },
        f"{adapters}/{{name}}": {"get": _op("One LoRA adapter", e, "Adapter", parameters=one)},
        f"{adapters}/{{name}}/load": {
            "post": _op("Load it on its base version's engine; 400 if refused", e, "Adapter", parameters=one)
        },
        f"{adapters}/{{name}}/unload": {
            "post": _op("Stop routing, let its requests finish, free it", e, "Adapter", parameters=one)
        },
        f"{adapters}/{{name}}/retire": {
            "post": _op("Unload if loaded; never loaded again", e, "Adapter", parameters=one)
        },
        f"{adapters}/{{name}}/grant": {
            "post": _op("Add a tenant to its access list", e, "Adapter", body="AdapterAccess", parameters=one)
        },
        f"{adapters}/{{name}}/revoke": {
            "post": _op("Remove a tenant from its access list", e, "Adapter", body="AdapterAccess", parameters=one)
        },
    }  # fmt: skip


def admin_paths(errors: dict[str, Any]) -> dict[str, Any]:
    """The admin paths; `errors` maps status codes to the shared error responses."""
    return {
        **_tenancy_paths(errors),
        **_model_paths(errors),
        **_prefix_cache_paths(errors),
        **_spend_paths(errors),
        **_adapter_paths(errors),
    }
