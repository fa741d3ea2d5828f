"""What the schema fuzzer's conformance checks found (issue 54, finding 9), on a real uvicorn on
127.0.0.1 (`serve_everything`: tenancy on SQLite, the fake engine, every admin route): each answer
is one `/openapi.json` declares, for values the document allows.

- A method a path does not take: 405 with `Allow` naming every method the document lists there.
- The streamed `/v1/completions` events are declared with their own chunk schema, as chat's are.
- Path parameters with control characters: a declared status (404 for a name that cannot exist).
- An empty filter (`?model_version=`) is outside the declared schema (minLength 1); `since > until` on
  `/v1/usage` is a declared 400 with the error shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.e2e.tenancy_server import ADMIN, FullServer, serve_everything
from tests.gateway.harness import MODEL
from weir.tenancy.admin_bodies.fields import MAX_QUERY_LEN

pytestmark = pytest.mark.slow

_METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("conformance")) as server:
        yield server


@pytest.fixture(scope="module")
def doc(full: FullServer) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(full.url + "/openapi.json").json()
    return document


def _headers(full: FullServer, op: dict[str, Any]) -> dict[str, str]:
    return ADMIN if op.get("security") == [{"admin_token": []}] else full.tenant


def _error_shape(r: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    ("method", "path"),
    [("TRACE", "/v1/models"), ("DELETE", "/v1/chat/completions"), ("TRACE", "/admin/v1/tenants"),
     ("PUT", "/admin/v1/models"), ("TRACE", "/v1/usage"), ("DELETE", "/admin/v1/tenants/acme")],
)  # fmt: skip
def test_a_method_not_allowed_names_every_allowed_one(
    full: FullServer, doc: dict[str, Any], method: str, path: str
) -> None:
    r = httpx.request(method, full.url + path, headers=ADMIN, timeout=30)
    assert r.status_code == 405, r.text
    _error_shape(r)
    allowed = {m.strip().lower() for m in r.headers["allow"].split(",")}
    documented = next(
        item for p, item in doc["paths"].items() if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", p), path)
    )
    assert set(documented) & _METHODS <= allowed  # every documented method is named
    assert method.lower() not in allowed


def test_streamed_completions_are_declared_with_their_chunk_schema(
    full: FullServer, doc: dict[str, Any]
) -> None:
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert chat["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/ChatCompletionChunk"}
    assert completions["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/CompletionChunk"}
    assert completions["application/json"]["schema"] != completions["text/event-stream"]["schema"]

    def validator(component: str) -> jsonschema.Draft202012Validator:
        schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
        return jsonschema.Draft202012Validator(schema)

    body = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(full.url + "/v1/completions", json=body, headers=full.tenant, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]" and len(events) > 2
    for event in events[:-1]:
        validator("CompletionChunk").validate(json.loads(event))
    # A stream event without usage is not a whole completion: the answer's schema requires it.
    first = json.loads(events[0])
    assert first["usage"] is None
    assert not validator("Completion").is_valid(first)


def test_path_parameters_with_control_characters_get_a_declared_status(
    full: FullServer, doc: dict[str, Any]
) -> None:
    checked = 0
    for path, item in doc["paths"].items():
        if "{" not in path:
            continue
        for method, op in item.items():
            for value in ("a%01b", "a%00b", "a%0Ab", "a%7Fb"):
                url = full.url + re.sub(r"\{\w+\}", value, path)
                body = {"to": "v1"} if path.endswith("/rollback") else {}
                r = httpx.request(method.upper(), url, headers=_headers(full, op), json=body, timeout=30)
                assert str(r.status_code) in op["responses"], f"{method} {path} {value}: {r.status_code}"
                assert r.status_code in (200, 404), f"{method} {path} {value}: {r.status_code} {r.text[:200]}"
                checked += 1
    assert checked > 40


def test_the_filters_declare_the_bounds_the_routes_enforce(doc: dict[str, Any]) -> None:
    """`bounded_query` refuses an empty or long value (422 naming it): the document says so, so an
    empty `?model=` is not a value it allows (tests/e2e/test_adapters_admin.py sends one)."""
    found = 0
    for path, method, name in [("/admin/v1/prices", "get", "model"), ("/admin/v1/budgets", "get", "tenant")]:
        (param,) = [p for p in doc["paths"][path][method]["parameters"] if p["name"] == name]
        assert (param["schema"]["minLength"], param["schema"]["maxLength"]) == (1, MAX_QUERY_LEN)
        assert "422" in doc["paths"][path][method]["responses"]
        found += 1
    assert found == 2


@pytest.mark.parametrize("path", ["/v1/usage", "/admin/v1/tenants/fuzz-tenant/usage"])
def test_since_after_until_is_a_declared_400(full: FullServer, doc: dict[str, Any], path: str) -> None:
    op = doc["paths"]["/v1/usage" if path == "/v1/usage" else "/admin/v1/tenants/{name}/usage"]["get"]
    headers = full.tenant if path == "/v1/usage" else ADMIN
    r = httpx.get(
        full.url + path, params={"since": "2026-02-02", "until": "2026-01-01"}, headers=headers, timeout=30
    )
    assert r.status_code == 400 and "400" in op["responses"], r.text
    error = _error_shape(r)
    assert error["param"] == "since" and "until" in error["message"]
    same_day = httpx.get(
        full.url + path, params={"since": "2026-01-01", "until": "2026-01-01"}, headers=headers
    )
    assert same_day.status_code == 200, same_day.text
