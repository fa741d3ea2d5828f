"""/openapi.json: every served operation is documented, and the request bounds it states are the
ones the validator enforces (both come from gateway.openai_fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from gateway.api_fields import BoolField, IntField, NumberField, StringField
from gateway.bootstrap import build_tenancy
from gateway.errors import BadRequestError
from gateway.model_fleet import ModelFleet
from gateway.model_rollout import ModelRollout
from gateway.openai_fields import GATEWAY_FIELDS, LOGIT_BIAS, MAX_LOGIT_BIAS, SAMPLING_FIELDS
from gateway.openapi import openapi_schema
from gateway.protocol import parse_chat_request
from gateway.routes.models_admin import models_admin_routes
from gateway.routes.prefix_cache import prefix_cache_routes
from gateway.routes.spend_admin import spend_admin_routes
from gateway.settings import AuthMode, Settings
from tests.e2e.tenancy_server import serve_everything
from tests.gateway.fake_engine import FakeEngine, FakePrefixCache
from tests.gateway.harness import MODEL, make_app, tokenizer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _accepts(name: str, value: Any) -> bool:
    try:
        parse_chat_request({**CHAT, name: value})
    except BadRequestError as exc:
        assert exc.param == name
        return False
    return True


SCALAR_FIELDS = [
    spec
    for spec in (*SAMPLING_FIELDS, *GATEWAY_FIELDS)
    if isinstance(spec, IntField | NumberField | BoolField | StringField)
]


@pytest.mark.parametrize("spec", SCALAR_FIELDS, ids=lambda s: s.name)
def test_documented_bounds_are_the_enforced_ones(
    spec: IntField | NumberField | BoolField | StringField,
) -> None:
    schema = openapi_schema(models=["m"])["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    documented = schema[spec.name]
    assert documented == spec.schema()
    if isinstance(spec, IntField):
        assert documented["minimum"] == spec.minimum and documented["maximum"] == spec.maximum
        assert _accepts(spec.name, spec.minimum) and _accepts(spec.name, spec.maximum)
        assert not _accepts(spec.name, spec.minimum - 1) and not _accepts(spec.name, spec.maximum + 1)
        assert not _accepts(spec.name, "1") and not _accepts(spec.name, True)
    elif isinstance(spec, NumberField):
        low = documented.get("minimum", documented.get("exclusiveMinimum"))
        assert _accepts(spec.name, low) is ("minimum" in documented)
        assert not _accepts(spec.name, low - 1e-9)
        if spec.maximum is not None:
            assert _accepts(spec.name, documented["maximum"]) and not _accepts(spec.name, spec.maximum + 1e-9)
        assert not _accepts(spec.name, 10**400)  # beyond a float: infinite
    elif isinstance(spec, BoolField):
        assert _accepts(spec.name, True) and not _accepts(spec.name, 1)
    else:
        assert _accepts(spec.name, "u" * spec.max_length) and not _accepts(
            spec.name, "u" * (spec.max_length + 1)
        )


def test_every_sampling_field_is_documented_in_both_bodies() -> None:
    schemas = openapi_schema(models=["m"])["components"]["schemas"]
    for body in ("ChatCompletionRequest", "CompletionRequest"):
        for spec in (*SAMPLING_FIELDS, *GATEWAY_FIELDS):
            assert schemas[body]["properties"][spec.name] == spec.schema(), (body, spec.name)


def test_logit_bias_is_documented_with_the_bounds_the_validator_enforces() -> None:
    documented = openapi_schema(models=["m"])["components"]["schemas"]["ChatCompletionRequest"]["properties"][
        "logit_bias"
    ]
    assert documented["maxProperties"] == MAX_LOGIT_BIAS
    assert documented["additionalProperties"] == {"type": "number", "minimum": -100.0, "maximum": 100.0}
    assert documented["propertyNames"] == {"pattern": LOGIT_BIAS.key_pattern}
    assert _accepts("logit_bias", {"0": -100, "999999999": 100})
    assert _accepts("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS)})
    assert not _accepts("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)})
    assert not _accepts("logit_bias", {"1": 100.5}) and not _accepts("logit_bias", {"1": -100.5})
    assert not _accepts("logit_bias", {"1000000000": 1}) and not _accepts("logit_bias", {"01": 1})
    assert not _accepts("logit_bias", {"1": True}) and not _accepts("logit_bias", ["1"])


def test_the_seed_range_is_the_generators() -> None:
    seed = openapi_schema()["components"]["schemas"]["ChatCompletionRequest"]["properties"]["seed"]
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**64 - 1)


def test_the_model_enum_is_the_served_names() -> None:
    with TestClient(make_app(FakeEngine(), vocab_size=100)) as client:
        schema = client.get("/openapi.json").json()
    for body in ("ChatCompletionRequest", "CompletionRequest"):
        assert schema["components"]["schemas"][body]["properties"]["model"]["enum"] == [MODEL]
    ids = schema["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]["oneOf"][2]
    assert ids["items"]["maximum"] == 99
    # Without tenancy, no admin operation is served, so none is documented.
    assert not any(path.startswith("/admin/") for path in schema["paths"])


def _routed(routes: list[Any], prefix: str = "") -> set[tuple[str, str]]:
    out = set()
    for route in routes:
        if isinstance(route, Mount):
            out |= _routed(route.routes, prefix + route.path)
        elif isinstance(route, Route) and "{path:path}" not in route.path:
            path = (prefix + route.path).replace("{model:path}", "{model}")
            out |= {(path, m.lower()) for m in (route.methods or ()) if m != "HEAD"}
    return out


def test_every_served_operation_is_documented_and_nothing_else(tmp_path: Path) -> None:
    with serve_everything(tmp_path) as server:
        doc = httpx.get(server.url + "/openapi.json").json()
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    # The same app, built the same way, to list its routes.
    tenancy = build_tenancy(Settings(data_dir=tmp_path, admin_token="x" * 20, auth=AuthMode.KEYS))
    assert tenancy.admin_auth is not None
    assert tenancy.model_versions is not None and tenancy.repo is not None
    rollout = ModelRollout(ModelFleet(), tenancy.model_versions)
    routes = [
        *prefix_cache_routes(FakePrefixCache(), tenancy.admin_auth, tokenizer()),
        *models_admin_routes(rollout, tenancy.admin_auth),
        *spend_admin_routes(tenancy.repo.db, tenancy.admin_auth),
        *tenancy.routes,
    ]
    app = make_app(FakeEngine(), extra_routes=routes)
    assert _routed(app.routes) == documented
    assert {"bearer", "admin_token"} <= set(doc["components"]["securitySchemes"])
    for path, item in doc["paths"].items():
        for op in item.values():
            if path.startswith("/admin/"):
                assert op["security"] == [{"admin_token": []}], path
