"""The app factory: probes, OpenAPI, error shapes, draining, auth mode wiring."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import Live
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, tokenizer
from weir.gateway.server.app import ANONYMOUS_TENANT, create_app
from weir.gateway.settings.settings import AuthMode, Settings

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def test_health_and_ready(live: Live) -> None:
    assert live.client.get("/health").status_code == 200
    assert live.client.get("/ready").json()["status"] == "ready"
    live.engine.ready = False
    assert live.client.get("/ready").status_code == 503
    assert live.client.get("/health").status_code == 200
    live.engine.alive = False
    assert live.client.get("/health").status_code == 503


def test_draining_refuses_new_work_and_fails_readiness(live: Live) -> None:
    state = live.app.state.gateway
    state.begin_drain()
    try:
        assert live.client.get("/ready").status_code == 503
        r = live.client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert live.engine.num_generate_calls == 0
        assert live.client.get("/health").status_code == 200
    finally:
        state.draining = False


def test_openapi_describes_the_public_api(live: Live) -> None:
    doc = live.client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/metrics"):
        assert path in doc["paths"]
    props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for name in (
        "messages",
        "max_completion_tokens",
        "stream_options",
        "top_k",
        "min_p",
        "priority",
        "logprobs",
    ):
        assert name in props


def test_unknown_route_and_method_are_openai_shaped(live: Live) -> None:
    r = live.client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = live.client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_malformed_json_is_400(live: Live) -> None:
    r = live.client.post(
        "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"
    assert live.engine.num_generate_calls == 0


def test_unexpected_errors_are_500_and_the_server_keeps_serving(live: Live) -> None:
    def explode(request: object) -> None:
        raise RuntimeError("bug")

    live.engine.fail_request = explode  # type: ignore[assignment]
    r = live.client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal server error"
    live.engine.fail_request = None
    assert live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}).status_code == 200


def test_keys_mode_needs_an_authenticator() -> None:
    with pytest.raises(ValueError, match="authenticate"):
        create_app(Settings(auth=AuthMode.KEYS), FakeEngine(), tokenizer(), max_model_len=64)
    app = make_app(FakeEngine(), Settings(auth=AuthMode.NONE, host="0.0.0.0"))
    assert app.state.gateway.draining is False


def test_anonymous_tenant() -> None:
    assert ANONYMOUS_TENANT.tenant_id == "default"
    assert ANONYMOUS_TENANT.quota.max_output_tokens is None


def test_lifespan_hooks_run() -> None:
    from starlette.testclient import TestClient

    calls: list[str] = []

    async def start() -> None:
        calls.append("start")

    async def stop() -> None:
        calls.append("stop")

    app = make_app(FakeEngine(), on_startup=[start], on_shutdown=[stop])
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert calls == ["start"]
    assert calls == ["start", "stop"]
