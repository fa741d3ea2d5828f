"""The JSON shapes of the model-version admin API (`/admin/v1/models...`), both ways, in one place:
the server's routes render and parse with it, and `weir admin models` (tenancy.admin_client)
builds its requests and reads the answers with it.

Parsing is strict like `tenancy.admin_codec`: unknown fields are refused and every error is a
`FieldError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tenancy.admin_codec import JsonObject, parse_datetime, parse_object, parse_optional_int, time_json
from tenancy.errors import FieldError
from tenancy.model_version_records import (
    ModelVersionSpec,
    ModelVersionState,
    ModelVersionView,
    TrafficPlan,
    validate_version_label,
)

SPEC_FIELDS = ("name", "version", "path", "dtype", "kv_cache_tokens", "tokenizer")
TRAFFIC_FIELDS = ("split", "pins")
ROLLBACK_FIELDS = ("to",)
VERSION_FIELDS = (
    "id",
    "name",
    "version",
    "path",
    "tokenizer",
    "dtype",
    "kv_cache_tokens",
    "state",
    "failure_reason",
    "created_at",
    "updated_at",
    "updated_by",
    "traffic_percent",
    "pinned_tenants",
    "in_flight",
    "kv_usage",
)


@dataclass(frozen=True)
class VersionRuntime:
    """What the server knows about a loaded version beyond its record."""

    in_flight: int = 0  # requests running on it now
    kv_usage: float | None = None  # fraction of its KV pool in use; None: not loaded


@dataclass(frozen=True)
class ModelVersionListing:
    """One entry of `GET /admin/v1/models`: the record, its traffic share and its runtime."""

    view: ModelVersionView
    traffic_percent: int
    pinned_tenants: tuple[str, ...]
    runtime: VersionRuntime


# -- request bodies ------------------------------------------------------------------------------


def _optional_str(data: Mapping[str, Any], field: str) -> str | None:
    value = data.get(field)
    if value is not None and not isinstance(value, str):
        raise FieldError(field, "must be a string or null")
    return value


def parse_spec(body: object) -> ModelVersionSpec:
    """`POST /admin/v1/models`: `{"name", "version", "path"}`, optional dtype, kv_cache_tokens,
    tokenizer."""
    data = parse_object(body, SPEC_FIELDS, "body")
    for required in ("name", "version", "path"):
        if required not in data:
            raise FieldError(required, "is required")
    return ModelVersionSpec(
        name=data["name"],
        version=data["version"],
        path=data["path"],
        tokenizer=_optional_str(data, "tokenizer"),
        dtype=_optional_str(data, "dtype"),
        kv_cache_tokens=parse_optional_int(data.get("kv_cache_tokens"), "kv_cache_tokens"),
    )


def spec_json(spec: ModelVersionSpec) -> JsonObject:
    """The request body of `POST /admin/v1/models` for this spec (optional fields only when set)."""
    body: JsonObject = {"name": spec.name, "version": spec.version, "path": spec.path}
    for field in ("dtype", "kv_cache_tokens", "tokenizer"):
        value = getattr(spec, field)
        if value is not None:
            body[field] = value
    return body


def _split(value: object, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise FieldError(where, "must be an object of version -> percent")
    split: dict[str, int] = {}
    for version, percent in value.items():
        number = parse_optional_int(percent, f"{where}.{version}")
        if number is None:
            raise FieldError(f"{where}.{version}", "must be an integer percent")
        split[version] = number
    return split


def _pins(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise FieldError(where, "must be an object of tenant -> version")
    return dict(value)  # TrafficPlan checks the names


def parse_traffic(name: str, body: object) -> TrafficPlan:
    """`PUT /admin/v1/models/{name}/traffic`: `{"split": {...}, "pins": {...}}`; the body is the
    whole plan (an absent part is empty)."""
    data = parse_object(body, TRAFFIC_FIELDS, "body")
    return TrafficPlan(
        name=name, split=_split(data.get("split"), "split"), pins=_pins(data.get("pins"), "pins")
    )


def traffic_body_json(plan: TrafficPlan) -> JsonObject:
    """The request body of `PUT /admin/v1/models/{name}/traffic` for this plan."""
    return {"split": dict(plan.split), "pins": dict(plan.pins)}


def parse_rollback(body: object) -> str:
    """`POST /admin/v1/models/{name}/rollback`: `{"to": "<version>"}`; returns the version."""
    data = parse_object(body, ROLLBACK_FIELDS, "body")
    if "to" not in data:
        raise FieldError("to", "is required")
    return validate_version_label(data["to"], "to")


def rollback_json(version: str) -> JsonObject:
    """The request body of a rollback to `version`."""
    return {"to": version}


# -- answers -------------------------------------------------------------------------------------


def traffic_json(plan: TrafficPlan) -> JsonObject:
    """A plan as the traffic and rollback routes answer it: `{"name", "split", "pins"}`."""
    return {"name": plan.name, **traffic_body_json(plan)}


def version_json(
    view: ModelVersionView, plan: TrafficPlan | None = None, runtime: VersionRuntime | None = None
) -> JsonObject:
    """A version with its share of `plan` (0 and no pins without one) and its runtime figures."""
    run = runtime if runtime is not None else VersionRuntime()
    return {
        "id": view.id,
        "name": view.name,
        "version": view.version,
        "path": view.path,
        "tokenizer": view.tokenizer,
        "dtype": view.dtype,
        "kv_cache_tokens": view.kv_cache_tokens,
        "state": view.state.value,
        "failure_reason": view.failure_reason,
        "created_at": time_json(view.created_at),
        "updated_at": time_json(view.updated_at),
        "updated_by": view.updated_by,
        "traffic_percent": 0 if plan is None else plan.percent(view.version),
        "pinned_tenants": [] if plan is None else list(plan.pinned_tenants(view.version)),
        "in_flight": run.in_flight,
        "kv_usage": run.kv_usage,
    }


def models_json(
    views: Iterable[ModelVersionView],
    plans: Mapping[str, TrafficPlan],
    runtimes: Mapping[str, VersionRuntime] | None = None,
) -> JsonObject:
    """`GET /admin/v1/models`: every version (runtime looked up by version id) and every plan."""
    found = runtimes or {}
    return {
        "data": [version_json(v, plans.get(v.name), found.get(v.id)) for v in views],
        "traffic": {name: traffic_body_json(plan) for name, plan in sorted(plans.items())},
    }


def _state(value: object) -> ModelVersionState:
    if isinstance(value, str) and value in ModelVersionState._value2member_map_:
        return ModelVersionState(value)
    raise FieldError("state", f"must be one of {', '.join(s.value for s in ModelVersionState)}")


def parse_version_json(obj: object) -> ModelVersionListing:
    """A version object as the server answered it (the inverse of `version_json`)."""
    data = parse_object(obj, VERSION_FIELDS, "version")
    try:
        spec = ModelVersionSpec(
            name=data["name"],
            version=data["version"],
            path=data["path"],
            tokenizer=data.get("tokenizer"),
            dtype=data.get("dtype"),
            kv_cache_tokens=data.get("kv_cache_tokens"),
        )
        view = ModelVersionView(
            id=spec.id,
            name=spec.name,
            version=spec.version,
            path=spec.path,
            tokenizer=spec.tokenizer,
            dtype=spec.dtype,
            kv_cache_tokens=spec.kv_cache_tokens,
            state=_state(data["state"]),
            failure_reason=_optional_str(data, "failure_reason"),
            created_at=parse_datetime(data["created_at"], "created_at"),
            updated_at=parse_datetime(data["updated_at"], "updated_at"),
            updated_by=str(data["updated_by"]),
        )
    except KeyError as missing:
        raise FieldError(str(missing.args[0]), "is missing from the version object") from None
    if data.get("id") != view.id:
        raise FieldError("id", f"must be {view.id!r}")
    pinned = data.get("pinned_tenants", [])
    if not isinstance(pinned, list) or not all(isinstance(t, str) for t in pinned):
        raise FieldError("pinned_tenants", "must be a list of tenant names")
    kv_usage = data.get("kv_usage")
    if kv_usage is not None and (
        isinstance(kv_usage, bool) or not isinstance(kv_usage, int | float) or not math.isfinite(kv_usage)
    ):
        raise FieldError("kv_usage", "must be a number or null")
    return ModelVersionListing(
        view=view,
        traffic_percent=parse_optional_int(data.get("traffic_percent", 0), "traffic_percent") or 0,
        pinned_tenants=tuple(pinned),
        runtime=VersionRuntime(
            in_flight=parse_optional_int(data.get("in_flight", 0), "in_flight") or 0,
            kv_usage=None if kv_usage is None else float(kv_usage),
        ),
    )


def parse_traffic_json(obj: object) -> TrafficPlan:
    """A plan as the traffic and rollback routes answer it (the inverse of `traffic_json`)."""
    data = parse_object(obj, ("name", *TRAFFIC_FIELDS), "body")
    if "name" not in data:
        raise FieldError("name", "is required")
    return parse_traffic(data["name"], {k: v for k, v in data.items() if k != "name"})


def parse_models_json(obj: object) -> tuple[list[ModelVersionListing], dict[str, TrafficPlan]]:
    """`GET /admin/v1/models` as the server answered it (the inverse of `models_json`)."""
    data = parse_object(obj, ("data", "traffic"), "body")
    items = data.get("data", [])
    if not isinstance(items, list):
        raise FieldError("data", "must be a list")
    traffic = data.get("traffic", {})
    if not isinstance(traffic, Mapping):
        raise FieldError("traffic", "must be an object of model name -> plan")
    plans = {str(name): parse_traffic(str(name), body) for name, body in traffic.items()}
    return [parse_version_json(item) for item in items], plans
