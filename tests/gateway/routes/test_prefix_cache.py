"""The prefix-cache admin API over a fake engine control: auth, JSON shapes, body errors, mapping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.gateway.fake_engine import FakeEngine, FakePrefixCache
from tests.gateway.harness import make_app, tokenizer
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.failure_throttle import FailureThrottle
from weir.gateway.metrics.prefix_cache_metrics import PrefixCacheCollector
from weir.gateway.routes.prefix_cache import prefix_cache_routes
from weir.tenancy.keys.keys import KeyHasher

TOKEN = "the-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/admin/v1/prefix-cache"


class _Store:
    hasher = KeyHasher(b"pepper")

    def admin_token_hash(self) -> str | None:
        return None


@pytest.fixture
def api() -> Iterator[tuple[TestClient, FakePrefixCache]]:
    control = FakePrefixCache()
    throttle = FailureThrottle.from_settings(AuthSettings(max_failures=10_000))
    auth = AdminAuthenticator(_Store(), TOKEN, throttle=throttle)
    # The whole app, so errors go through its one mapper and its error metric, as when served.
    app = make_app(FakeEngine(), extra_routes=prefix_cache_routes(control, auth, tokenizer()))
    with TestClient(app) as client:
        yield client, control


def _num_errors(client: TestClient, status: int) -> float:
    registry = client.app.state.metrics.registry  # type: ignore[attr-defined]
    return registry.get_sample_value("weir_request_errors_total", {"status": str(status)}) or 0.0


def test_every_endpoint_needs_the_admin_token(api: tuple[TestClient, FakePrefixCache]) -> None:
    client, control = api
    for method, path in (
        ("GET", "/stats"),
        ("GET", "/tenants/acme"),
        ("GET", "/prefixes"),
        ("POST", "/prefixes"),
        ("DELETE", "/prefixes/p0"),
        ("POST", "/prefixes/p0/pin"),
        ("POST", "/flush"),
        ("GET", "/nope"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = client.request(method, BASE + path, headers=headers)
            assert r.status_code == 401, (method, path)
            assert r.json()["error"]["code"] == "invalid_admin_token"
    assert not control.calls
    assert _num_errors(client, 401) == 16
    r = client.get(BASE + "/nope", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_stats_overall_and_per_tenant(api: tuple[TestClient, FakePrefixCache]) -> None:
    client, _ = api
    body = client.get(BASE + "/stats", headers=ADMIN).json()
    assert body["object"] == "prefix_cache.stats"
    assert (body["hit_rate"], body["cached_tokens"], body["evictions"]) == (0.6, 480, 7)
    assert body["tenants"] == [
        {"tenant": "acme", "cache_scope": "acme", "queries": 3, "queried_tokens": 300, "hit_tokens": 240,
         "hit_rate": 0.8, "cached_blocks": 10, "cached_tokens": 160, "evictions": 2}
    ]  # fmt: skip
    assert {s["cache_scope"] for s in body["scopes"]} == {"acme", "<shared>"}
    assert client.get(BASE + "/tenants/acme", headers=ADMIN).json()["hit_rate"] == 0.8
    unseen = client.get(BASE + "/tenants/globex", headers=ADMIN).json()
    assert unseen["tenant"] == "globex" and unseen["queries"] == 0 and unseen["hit_rate"] == 0.0


def test_register_from_token_ids_text_or_messages(api: tuple[TestClient, FakePrefixCache]) -> None:
    client, control = api
    r = client.post(
        BASE + "/prefixes", json={"token_ids": [5, 6, 7, 8, 9], "name": "sys", "pin": True}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    assert r.json() | {"created_at": 0} == {
        "object": "prefix_cache.prefix", "id": "p0", "name": "sys", "num_tokens": 5, "num_shared_tokens": 4,
        "num_blocks": 1, "num_cached_blocks": 1, "pinned": True, "created_at": 0,
    }  # fmt: skip
    text = "hello world hello world hello world"
    assert client.post(BASE + "/prefixes", json={"text": text}, headers=ADMIN).status_code == 201
    assert control.calls[-1][1][0] == tokenizer().encode(text, add_special_tokens=True)
    messages = [{"role": "system", "content": "hello world " * 4}]
    assert client.post(BASE + "/prefixes", json={"messages": messages}, headers=ADMIN).status_code == 201
    rendered = tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert control.calls[-1][1][0] == tokenizer().encode(rendered, add_special_tokens=False)
    listed = client.get(BASE + "/prefixes", headers=ADMIN).json()
    assert [p["id"] for p in listed["data"]] == ["p0", "p1", "p2"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 422, "token_ids"),
        ({"token_ids": [1, 2, 3, 4], "text": "x"}, 422, "token_ids"),
        ({"token_ids": "1 2 3"}, 422, "token_ids"),
        ({"token_ids": [1, True, 3, 4]}, 422, "token_ids"),
        ({"token_ids": [1, 2]}, 422, "token_ids"),  # the engine refuses it
        ({"text": ""}, 422, "text"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),  # as the chat route
        ({"messages": []}, 400, "messages"),
        ({"token_ids": [1, 2, 3, 4], "pin": "yes"}, 422, "pin"),
        ({"token_ids": [1, 2, 3, 4], "scope": "acme"}, 422, "scope"),
    ],
)
def test_register_body_errors_name_the_field(
    api: tuple[TestClient, FakePrefixCache], body: dict[str, Any], status: int, param: str
) -> None:
    client, _ = api
    r = client.post(BASE + "/prefixes", json=body, headers=ADMIN)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_bad_json_unknown_prefix_pin_capacity_and_a_dead_engine(
    api: tuple[TestClient, FakePrefixCache],
) -> None:
    client, control = api
    assert client.post(BASE + "/prefixes", content=b"[1,2]", headers=ADMIN).status_code == 400
    assert client.post(BASE + "/prefixes", content=b"{", headers=ADMIN).status_code == 400
    for method, path in (("GET", "/prefixes/zz"), ("DELETE", "/prefixes/zz"), ("POST", "/prefixes/zz/unpin")):
        r = client.request(method, BASE + path, headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["code"] == "prefix_not_found"
    for i in range(2):
        client.post(BASE + "/prefixes", json={"token_ids": [i] * 8, "pin": True}, headers=ADMIN)
    r = client.post(BASE + "/prefixes", json={"token_ids": [9] * 8, "pin": True}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["code"] == "pin_capacity"
    assert client.post(BASE + "/prefixes/p0/unpin", headers=ADMIN).json()["pinned"] is False
    assert client.post(BASE + "/prefixes/p0/pin", headers=ADMIN).json()["pinned"] is True
    assert client.delete(BASE + "/prefixes/p0", headers=ADMIN).json()["id"] == "p0"
    control.dead = True
    assert client.get(BASE + "/stats", headers=ADMIN).status_code == 503
    # Every error was answered by the app's one mapper and counted, like any route's.
    assert {status: _num_errors(client, status) for status in (400, 404, 409, 503)} == {
        400: 2,
        404: 3,
        409: 1,
        503: 1,
    }


def test_flush_by_model_version_tenant_or_scope(api: tuple[TestClient, FakePrefixCache]) -> None:
    client, control = api
    for body, args in (
        ({}, (None, None, None, False)),
        ({"model_version": "v1"}, ("v1", None, None, False)),
        ({"tenant": "acme"}, (None, "acme", None, False)),
        ({"cache_scope": "team", "include_pinned": True}, (None, None, "team", True)),
    ):
        r = client.post(BASE + "/flush", json=body, headers=ADMIN)
        assert r.status_code == 200 and r.json()["flushed_blocks"] == 5
        assert control.calls[-1] == ("flush", args)
    r = client.post(BASE + "/flush", json={"model_version": "v0"}, headers=ADMIN)
    assert r.json()["model_version_matched"] is False
    assert client.post(BASE + "/flush", json={"tenant": 3}, headers=ADMIN).status_code == 422
    assert client.post(BASE + "/flush", json={"everything": True}, headers=ADMIN).status_code == 422


def test_metrics_per_tenant_and_scope() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(PrefixCacheCollector(FakePrefixCache().snapshot))
    text = generate_latest(registry).decode()
    assert 'weir_prefix_cache_tenant_hit_tokens_total{tenant="acme"} 240.0' in text
    assert 'weir_prefix_cache_tenant_queried_tokens_total{tenant="acme"} 300.0' in text
    assert 'weir_prefix_cache_tenant_queries_total{tenant="acme"} 3.0' in text
    assert 'weir_prefix_cache_cached_blocks{scope="<shared>"} 4.0' in text
    assert 'weir_prefix_cache_evictions_total{scope="acme"} 2.0' in text
    assert "weir_prefix_cache_pinned_blocks 4.0" in text


def test_messages_are_read_as_a_chat_body_reads_them(api: tuple[TestClient, FakePrefixCache]) -> None:
    """Content parts are text, as in /v1/chat/completions; a part of another type is its 400."""
    client, control = api
    text = [{"role": "system", "content": "hello world " * 4}]
    parts = [{"role": "system", "content": [{"type": "text", "text": "hello world " * 2}] * 2}]
    for messages in (text, parts):
        assert client.post(BASE + "/prefixes", json={"messages": messages}, headers=ADMIN).status_code == 201
    registered = [call[1] for call in control.calls if call[0] == "register"]
    assert registered[-1] == registered[-2]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = client.post(BASE + "/prefixes", json={"messages": image}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].type", r.text
