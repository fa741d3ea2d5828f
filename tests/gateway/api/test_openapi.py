"""/openapi.json: every served operation is documented, and the request bounds it states are the
ones the validator enforces (both come from the models of weir.gateway.api.openai_bodies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from tests.e2e.tenancy_server import serve_everything
from tests.gateway.fake_engine import FakeEngine, FakePrefixCache
from tests.gateway.harness import MODEL, make_app, tokenizer
from weir.engine.sampling_bounds import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_N, PENALTY_MAX
from weir.gateway.api.openai_bodies.requests import SAMPLING_FIELDS, TOKEN_KEY_PATTERN
from weir.gateway.api.openapi import LiveDocument, openapi_schema
from weir.gateway.api.protocol import parse_chat_request
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.errors import BadRequestError
from weir.gateway.routes.models_admin import models_admin_routes
from weir.gateway.routes.prefix_cache import prefix_cache_routes
from weir.gateway.routes.spend_admin import spend_admin_routes
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# What a field needs beside it (documented as `dependentSchemas`).
NEEDS = {"top_logprobs": {"logprobs": True}}


def _accepts(name: str, value: Any) -> bool:
    try:
        parse_chat_request({**CHAT, **NEEDS.get(name, {}), name: value})
    except BadRequestError as exc:
        assert exc.param == name
        return False
    return True


def _chat_properties() -> dict[str, Any]:
    return openapi_schema(models=["m"])["components"]["schemas"]["ChatCompletionRequest"]["properties"]


def _scalar(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null alternative of an optional field's schema."""
    alternatives = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    return alternatives[0] if len(alternatives) == 1 else {}


SCALARS = sorted(
    (name, _scalar(schema))
    for name, schema in _chat_properties().items()
    if _scalar(schema).get("type") in ("integer", "number", "boolean", "string") and name != "model"
)


@pytest.mark.parametrize(("name", "documented"), SCALARS, ids=[n for n, _ in SCALARS])
def test_documented_bounds_are_the_enforced_ones(name: str, documented: dict[str, Any]) -> None:
    kind = documented["type"]
    if kind == "integer":
        low, high = documented["minimum"], documented["maximum"]
        assert _accepts(name, high) and not _accepts(name, high + 1)
        assert _accepts(name, low) is (documented.get("not") != {"const": low})
        assert not _accepts(name, low - 1)
        assert not _accepts(name, "1") and not _accepts(name, True)
    elif kind == "number":
        low = documented.get("minimum", documented.get("exclusiveMinimum"))
        assert _accepts(name, low) is ("minimum" in documented)
        assert not _accepts(name, low - 1e-9)
        if "maximum" in documented:
            assert _accepts(name, documented["maximum"]) and not _accepts(name, documented["maximum"] + 1e-9)
        assert not _accepts(name, 10**400)  # beyond a float: infinite
        assert not _accepts(name, "1") and not _accepts(name, True)
    elif kind == "boolean":
        assert _accepts(name, True) and not _accepts(name, 1)
    else:
        assert _accepts(name, "u" * documented["maxLength"]) and not _accepts(
            name, "u" * (documented["maxLength"] + 1)
        )


def test_the_bounds_are_the_engines() -> None:
    properties = _chat_properties()
    assert _scalar(properties["n"])["maximum"] == MAX_N
    assert _scalar(properties["top_logprobs"])["maximum"] == MAX_LOGPROBS
    assert properties["presence_penalty"]["maximum"] == PENALTY_MAX


def test_every_sampling_field_is_documented_in_both_bodies() -> None:
    schemas = openapi_schema(models=["m"])["components"]["schemas"]
    chat, completion = (
        schemas["ChatCompletionRequest"]["properties"],
        schemas["CompletionRequest"]["properties"],
    )
    for name in (*SAMPLING_FIELDS, "stop", "stop_token_ids", "logit_bias", "max_tokens", "stream", "user"):
        assert chat[name] == completion[name], name


def test_logit_bias_is_documented_with_the_bounds_the_validator_enforces() -> None:
    documented = _scalar(_chat_properties()["logit_bias"])
    assert documented["maxProperties"] == MAX_LOGIT_BIAS
    assert documented["patternProperties"] == {
        TOKEN_KEY_PATTERN: {"type": "number", "minimum": -100.0, "maximum": 100.0}
    }
    assert documented["additionalProperties"] is False
    assert _accepts("logit_bias", {"0": -100, "999999999": 100})
    assert _accepts("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS)})
    assert not _accepts("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)})
    assert not _accepts("logit_bias", {"1": 100.5}) and not _accepts("logit_bias", {"1": -100.5})
    assert not _accepts("logit_bias", {"1000000000": 1}) and not _accepts("logit_bias", {"01": 1})
    assert not _accepts("logit_bias", {"1": True}) and not _accepts("logit_bias", ["1"])


def test_the_seed_range_is_the_generators() -> None:
    seed = _scalar(_chat_properties()["seed"])
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**64 - 1)


def test_the_answers_document_usage_details_and_refusal() -> None:
    schemas = openapi_schema()["components"]["schemas"]
    assert {"prompt_tokens_details", "completion_tokens_details"} <= set(schemas["Usage"]["properties"])
    assert "refusal" in schemas["AssistantMessage"]["properties"]
    assert "refusal" in schemas["ChoiceLogprobs"]["properties"]


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


def test_the_live_document_follows_the_served_models_and_vocabulary() -> None:
    document = LiveDocument()
    first = document.render(["a"], 100)
    assert document.render(["a"], 100) is first  # unchanged: served as rendered
    schemas = json.loads(document.render(["b", "a"], 50))["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == ["a", "b"]
    ids = schemas["CompletionRequest"]["properties"]["prompt"]["oneOf"][2]
    assert ids["items"]["maximum"] == 49
