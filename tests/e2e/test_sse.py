"""Raw HTTP: SSE framing exactly as OpenAI sends it, and malformed requests."""

from __future__ import annotations

import json

import httpx

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}


def raw_stream(http: httpx.Client, path: str, body: dict[str, object]) -> tuple[httpx.Response, bytes]:
    with http.stream("POST", path, json=body) as r:
        return r, r.read()


def test_chat_sse_framing(http: httpx.Client) -> None:
    r, raw = raw_stream(http, "/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    assert raw.endswith(b"data: [DONE]\n\n")
    events = raw.split(b"\n\n")
    assert events[-1] == b""  # every event ends with a blank line
    events = events[:-1]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert [c["choices"][0]["delta"].get("content") is not None for c in chunks[1:-1]] == [True] * 3
    assert chunks[-1]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "system_fingerprint", "choices"}
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]


def test_completion_sse_with_usage(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r, raw = raw_stream(http, "/v1/completions", body)
    events = [e[6:] for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert (
        chunks[-1]["choices"] == []
        and chunks[-1]["usage"]["total_tokens"] == chunks[-1]["usage"]["prompt_tokens"] + 2
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


def test_non_stream_body_shape(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json=CHAT).json()
    assert set(body) == {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
    assert set(body["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert set(body["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }


def test_malformed_json(http: httpx.Client, fake: FakeEngine) -> None:
    for raw in (b"{", b"not json", b"[]", b'{"model": "x", }', b"\xff\xfe"):
        r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, raw
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"
    assert fake.num_generate_calls == 0


def test_wrong_type_is_400_naming_the_field(http: httpx.Client, fake: FakeEngine) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": "many"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    assert fake.num_generate_calls == 0


def test_unknown_fields_are_ignored(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions", json={**CHAT, "store": True, "metadata": {"a": "b"}, "service_tier": "auto"}
    )
    assert r.status_code == 200
