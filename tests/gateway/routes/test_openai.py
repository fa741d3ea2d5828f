"""The /v1 handlers: what reaches the engine, and everything that must not."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Live
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MAX_MODEL_LEN, MODEL, make_app, serve_in_thread, tokenizer
from weir.engine.request import Priority
from weir.tenancy.context import QuotaLimits, TenantContext

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}]}


def post(live: Live, path: str, body: Any, **kw: Any) -> httpx.Response:
    return live.client.post(path, json=body, **kw)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({**CHAT, "temperature": "hot"}, 400, "temperature"),
        ({**CHAT, "temperature": -1}, 400, "temperature"),
        ({**CHAT, "top_p": 0}, 400, "top_p"),
        ({**CHAT, "n": 0}, 400, "n"),
        ({**CHAT, "max_tokens": 0}, 400, "max_tokens"),
        ({**CHAT, "presence_penalty": 3}, 400, "presence_penalty"),
        ({**CHAT, "top_k": 0}, 400, "top_k"),
        ({**CHAT, "stop": [""]}, 400, "stop"),
        ({**CHAT, "model": "gpt-4"}, 404, "model"),
        ({**CHAT, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
        ({"model": MODEL}, 400, "messages"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            400,
            "tools",
        ),
    ],
)
def test_bad_chat_requests_never_reach_the_engine(
    live: Live, body: dict[str, Any], status: int, param: str
) -> None:
    r = post(live, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}
    assert live.engine.num_generate_calls == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": [1, 10_000]}, "prompt"),
        ({"model": MODEL, "prompt": ["hello", [1]]}, "prompt"),
        ({"model": MODEL, "prompt": "hello", "logprobs": 21}, "logprobs"),
        ({"model": MODEL, "prompt": "hello", "echo": True}, "echo"),
        ({"model": MODEL, "prompt": [[1] * (MAX_MODEL_LEN - 10), [1]], "max_tokens": 11}, "max_tokens"),
    ],
)
def test_bad_completion_requests_never_reach_the_engine(live: Live, body: dict[str, Any], param: str) -> None:
    r = post(live, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert live.engine.num_generate_calls == 0


def test_context_length_error_carries_the_counts(live: Live) -> None:
    r = post(live, "/v1/completions", {"model": MODEL, "prompt": [1] * 200, "max_tokens": 100})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN}" in error["message"]
    assert "300 tokens (200 in the prompt, 100 for the completion)" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL, "prompt": [1] * MAX_MODEL_LEN, "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [1] * MAX_MODEL_LEN}, "prompt"),  # default max_tokens
        ("/v1/completions", {"model": MODEL, "prompt": [1] * 200, "max_tokens": 100}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ],
)
def test_a_context_length_error_names_the_field_of_its_endpoint(
    live: Live, path: str, body: dict[str, Any], param: str
) -> None:
    """Issue 21 item 5: a completion's prompt at the context length was blamed on `messages`."""
    r = post(live, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error


def test_engine_request_fields(live: Live) -> None:
    body = {
        **CHAT, "max_tokens": 7, "temperature": 0.3, "top_p": 0.8, "top_k": 5, "min_p": 0.1, "seed": 9,
        "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5, "stop": ["x", "y"],
        "ignore_eos": True, "n": 2, "logprobs": True, "top_logprobs": 3, "priority": "batch",
        "logit_bias": {"12": 100, "3": -100},
    }  # fmt: skip
    assert post(live, "/v1/chat/completions", body).status_code == 200
    (req,) = live.engine.requests
    sp = req.sampling_params
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (7, 0.3, 0.8, 5, 0.1, 9)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.2, 0.5, -0.5)
    assert sp.stop == ("x", "y") and sp.ignore_eos and sp.n == 2 and sp.logprobs == 3
    assert sp.logit_bias == ((12, 100.0), (3, -100.0))
    assert req.priority is Priority.BATCH
    assert req.request_id.startswith("chatcmpl-")
    assert req.tenant_id == "default" and req.cache_scope == "default"
    expected = tokenizer().apply_chat_template(CHAT["messages"], tokenize=False, add_generation_prompt=True)
    assert list(req.prompt_token_ids) == tokenizer().encode(expected, add_special_tokens=False)


def test_logit_bias_with_beam_search_is_a_400_naming_it(live: Live) -> None:
    body = {**CHAT, "max_tokens": 2, "use_beam_search": True, "n": 2, "logit_bias": {"1": 5}}
    r = post(live, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    assert live.engine.requests == []


def test_default_max_tokens(live: Live) -> None:
    post(live, "/v1/chat/completions", {**CHAT, "max_tokens": None})
    post(live, "/v1/completions", {"model": MODEL, "prompt": "hello"})
    chat, completion = live.engine.requests
    assert chat.sampling_params.max_tokens == MAX_MODEL_LEN - len(chat.prompt_token_ids)
    assert completion.sampling_params.max_tokens == 16


def test_several_prompts_become_several_engine_requests(live: Live) -> None:
    r = post(live, "/v1/completions", {"model": MODEL, "prompt": [[4, 5], [6]], "max_tokens": 2, "n": 2})
    assert r.status_code == 200
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [q.prompt_token_ids for q in live.engine.requests] == [(4, 5), (6,)]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 8
    ids = [q.request_id for q in live.engine.requests]
    assert ids == [body["id"] + "-0", body["id"] + "-1"]


def test_models(live: Live) -> None:
    body = live.client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]
    assert live.client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert live.client.get("/v1/models/nope").status_code == 404


def test_usage_reports_cached_tokens(live: Live) -> None:
    live.engine.num_cached_tokens = 4
    usage = post(live, "/v1/chat/completions", {**CHAT, "max_tokens": 2}).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4}


def tenant(quota: QuotaLimits, priority: Priority = Priority.STANDARD) -> TenantContext:
    return TenantContext("acme", "key1", priority, 1.0, "acme-scope", quota)


@pytest.fixture(scope="module")
def quota_server() -> Any:
    engine = FakeEngine()
    tenants = {
        "Bearer limited": tenant(QuotaLimits(max_prompt_tokens=12, max_output_tokens=5, models=("other",))),
        "Bearer capped": tenant(QuotaLimits(max_output_tokens=5), Priority.BATCH),
        "Bearer short": tenant(QuotaLimits(max_prompt_tokens=12)),
    }

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        from weir.gateway.http.errors import AuthenticationError

        if authorization not in tenants:
            raise AuthenticationError("bad key")
        return tenants[authorization]

    with (
        serve_in_thread(make_app(engine, authenticate=authenticate)) as url,
        httpx.Client(base_url=url) as client,
    ):
        yield engine, client


def test_authentication_is_required_when_an_authenticator_is_given(quota_server: Any) -> None:
    engine, client = quota_server
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models").status_code == 401


def test_tenant_quotas(quota_server: Any) -> None:
    engine, client = quota_server
    engine.reset()
    limited = {"authorization": "Bearer limited"}
    capped = {"authorization": "Bearer capped"}
    r = client.post("/v1/chat/completions", json=CHAT, headers=limited)
    assert r.status_code == 403 and r.json()["error"]["param"] == "model"
    assert client.get("/v1/models", headers=limited).json()["data"] == []
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6}, headers=capped)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1] * 13}, headers=capped)
    assert r.status_code == 200  # no prompt cap on this tenant
    assert engine.num_generate_calls == 1
    # Defaults are capped by the quota; the client may lower its priority, never raise it.
    r = client.post("/v1/chat/completions", json={**CHAT, "priority": "interactive"}, headers=capped)
    assert r.status_code == 403 and r.json()["error"]["param"] == "priority"
    assert r.json()["error"]["code"] == "priority_not_allowed"
    r = client.post("/v1/chat/completions", json={**CHAT, "priority": "batch"}, headers=capped)
    assert r.status_code == 200
    req = engine.requests[-1]
    assert req.sampling_params.max_tokens == 5
    assert req.priority is Priority.BATCH
    assert (req.tenant_id, req.cache_scope) == ("acme", "acme-scope")


def test_prompt_quota(quota_server: Any) -> None:
    engine, client = quota_server
    engine.reset()
    short = {"authorization": "Bearer short"}
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1] * 13}, headers=short)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "prompt_too_long" and r.json()["error"]["param"] == "prompt"
    r = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": [1] * 12, "max_tokens": 1}, headers=short
    )
    assert r.status_code == 200
    assert engine.num_generate_calls == 1


def test_beam_search_fields_reach_the_engine(live: Live) -> None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3, "n": 2}
    beam = {"use_beam_search": True, "beam_width": 4, "length_penalty": 0.5}
    assert post(live, "/v1/completions", {**body, **beam}).status_code == 200
    assert post(live, "/v1/completions", {**body, "use_beam_search": True}).status_code == 200
    first, second = (r.sampling_params for r in live.engine.requests)
    assert (first.use_beam_search, first.beam_width, first.length_penalty, first.n) == (True, 4, 0.5, 2)
    assert second.use_beam_search and second.beam_width == 2  # the width defaults to n
    for bad, param in (({"beam_width": "wide"}, "beam_width"), ({"beam_width": 0}, "beam_width")):
        r = post(live, "/v1/completions", {**body, "use_beam_search": True, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_the_cache_scope_comes_from_the_key_never_the_body(quota_server: Any) -> None:
    engine, client = quota_server
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "cache_scope": "someone-else", "tenant": "x"}
    r = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer short"})
    assert r.status_code == 200, r.text
    assert engine.requests[-1].cache_scope == "acme-scope" and engine.requests[-1].tenant_id == "acme"


def test_a_request_cancelled_in_admission_gives_its_model_version_back() -> None:
    # A request holds its version from routing on (a retire waits for it): cancelled while it
    # waited in admission (a server shutting down, a disconnect some servers cancel on), it must
    # not hold the version for ever.
    entered = asyncio.Event()

    async def waiting_admission(tenant: TenantContext, requests: Any) -> Any:
        entered.set()
        await asyncio.Event().wait()

    app = make_app(FakeEngine(), admission=waiting_admission)
    version = app.state.fleet.versions()[0]

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            call = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
            await asyncio.wait_for(entered.wait(), 5)
            assert version.in_flight == 1
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        assert version.in_flight == 0

    asyncio.run(scenario())
