"""The OpenAPI description of the price and window-budget admin API (`gateway.routes.spend_admin`).

Schemas come from the pydantic bodies (`tenancy.spend_api`); `gateway.openapi_admin` merges them
and these paths into `/admin/openapi.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from tenancy.spend_api import BudgetBody, BudgetOut, PriceBody, PriceOut

_MODELS: dict[str, type[BaseModel]] = {
    "PriceBody": PriceBody,
    "Price": PriceOut,
    "BudgetBody": BudgetBody,
    "Budget": BudgetOut,
}


def spend_schemas() -> dict[str, Any]:
    """Component schemas: the bodies, and the enums they share, referenced as components."""
    out: dict[str, Any] = {}
    for name, model in _MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[name] = schema
    return out


def spend_paths(op: Callable[..., dict[str, Any]], errors: dict[str, Any]) -> dict[str, Any]:
    """The paths; `op` is `gateway.openapi_admin`'s operation builder."""

    def query(name: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}

    budget_id = {"name": "budget_id", "in": "path", "required": True, "schema": {"type": "integer"}}
    return {
        "/admin/v1/prices": {
            "get": op("The price table, oldest first per model", errors, parameters=[query("model")]),
            "post": op(
                "Add a price of a model version or model, effective now or later (audited; recorded "
                "spend is never rewritten)",
                errors,
                ok="201",
                body="PriceBody",
            ),
        },
        "/admin/v1/budgets": {
            "get": op(
                "Token and money budgets over windows, with the current window's count and reset",
                errors,
                parameters=[query("tenant")],
            ),
            "put": op(
                "Set a tenant's or key's budget over a window (soft: alert; hard: 429)",
                errors,
                body="BudgetBody",
            ),
        },
        "/admin/v1/budgets/{budget_id}": {"delete": op("Remove a budget", errors, parameters=[budget_id])},
    }
