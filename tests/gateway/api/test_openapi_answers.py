"""Real answers of every OpenAI route validate against the `/openapi.json` the server serves: the
document is generated from the models of `weir.gateway.api.openai_bodies.responses`, the answers are
rendered by hand (`weir.gateway.api.responses`, `Usage.to_openai`, the model cards), so drift fails here."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.gateway.conftest import Live
from tests.gateway.harness import MODEL
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason
from weir.gateway.api.responses import ChatFormatter, ChoiceState
from weir.gateway.api.structured_bodies import parse_tool_fields
from weir.gateway.api.tool_calls import tools_request
from weir.gateway.api.usage import Usage

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "hello world", "max_tokens": 4}


def _validator(doc: dict[str, Any], component: str) -> jsonschema.Draft202012Validator:
    """A validator of one component of `doc` (its references resolve inside `doc`)."""
    schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


def _operation_schema(doc: dict[str, Any], path: str, method: str, status: str, media: str) -> str:
    """The component `doc` names for an answer, as a client reading the document finds it."""
    ref: str = doc["paths"][path][method]["responses"][status]["content"][media]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def _events(text: str) -> list[dict[str, Any]]:
    data = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.fixture(scope="module")
def doc(live_server: Live) -> dict[str, Any]:
    document: dict[str, Any] = live_server.client.get("/openapi.json").json()
    return document


def _check(doc: dict[str, Any], path: str, method: str, body: Any, status: str = "200") -> None:
    media = "application/json"
    _validator(doc, _operation_schema(doc, path, method, status, media)).validate(body)


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2, "n": 2}])
def test_chat_answers(live: Live, doc: dict[str, Any], extra: dict[str, Any]) -> None:
    r = live.client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text
    _check(doc, "/v1/chat/completions", "post", r.json())


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2, "n": 2}])
def test_chat_stream_chunks(live: Live, doc: dict[str, Any], extra: dict[str, Any]) -> None:
    body = {**CHAT, **extra, "stream": True, "stream_options": {"include_usage": True}}
    r = live.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    chunk = _operation_schema(doc, "/v1/chat/completions", "post", "200", "text/event-stream")
    events = _events(r.text)
    assert events[-1]["usage"] is not None and len(events) > 3
    for event in events:
        _validator(doc, chunk).validate(event)


@pytest.mark.parametrize("extra", [{}, {"logprobs": 2, "n": 2}, {"prompt": ["a", "b"]}])
def test_completion_answers_and_chunks(live: Live, doc: dict[str, Any], extra: dict[str, Any]) -> None:
    r = live.client.post("/v1/completions", json={**COMPLETION, **extra})
    assert r.status_code == 200, r.text
    _check(doc, "/v1/completions", "post", r.json())
    body = {**COMPLETION, **extra, "stream": True, "stream_options": {"include_usage": True}}
    r = live.client.post("/v1/completions", json=body)
    chunk = _operation_schema(doc, "/v1/completions", "post", "200", "text/event-stream")
    for event in _events(r.text):
        _validator(doc, chunk).validate(event)


def test_models_answers(live: Live, doc: dict[str, Any]) -> None:
    _check(doc, "/v1/models", "get", live.client.get("/v1/models").json())
    _check(doc, "/v1/models/{model}", "get", live.client.get(f"/v1/models/{MODEL}").json())


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "400"),
        ("/v1/chat/completions", {**CHAT, "model": "nope"}, "404"),
        ("/v1/completions", {**COMPLETION, "echo": True}, "400"),
    ],
)
def test_error_answers(live: Live, doc: dict[str, Any], path: str, body: dict[str, Any], status: str) -> None:
    r = live.client.post(path, json=body)
    assert str(r.status_code) == status, r.text
    _check(doc, path, "post", r.json(), status)


def test_tool_calls_usage_details_and_refusal(doc: dict[str, Any]) -> None:
    """What the fake engine does not produce: calls parsed out of the text, speculation's counts."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    tools = tools_request(parse_tool_fields({"tools": [weather]}))
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    f = ChatFormatter("chatcmpl-1", 1, MODEL, "fp", lambda t: "a", tools=tools, include_usage=True)
    usage = Usage(
        prompt_tokens=3, completion_tokens=5, cached_tokens=0, draft_tokens=4, accepted_draft_tokens=3
    )
    full = f.response([ChoiceState([text], finish_reason="stop")], usage)
    assert full["choices"][0]["message"]["tool_calls"] and "completion_tokens_details" in full["usage"]
    _validator(doc, "ChatCompletion").validate(full)
    out = RequestOutput("r", 0, (1,), text, True, FinishReason.STOP)
    chunks = [*f.start_chunks(1), *f.output_chunks(0, out), f.usage_chunk(usage)]
    events = [json.loads(c.removeprefix(b"data: ")) for c in chunks]
    assert any("tool_calls" in e["choices"][0]["delta"] for e in events if e["choices"])
    for event in events:
        _validator(doc, "ChatCompletionChunk").validate(event)


def test_responses_answers(live: Live, doc: dict[str, Any]) -> None:
    """The Responses route's answers: created, stored, listed, deleted, refused."""
    r = live.client.post(
        "/v1/responses", json={"model": MODEL, "input": "hello world", "max_output_tokens": 4}
    )
    assert r.status_code == 200, r.text
    _check(doc, "/v1/responses", "post", r.json())
    response_id = r.json()["id"]
    _check(doc, "/v1/responses/{response_id}", "get", live.client.get(f"/v1/responses/{response_id}").json())
    items = live.client.get(f"/v1/responses/{response_id}/input_items").json()
    _check(doc, "/v1/responses/{response_id}/input_items", "get", items)
    assert items["data"]
    _check(
        doc,
        "/v1/responses/{response_id}",
        "delete",
        live.client.delete(f"/v1/responses/{response_id}").json(),
    )
    missing = live.client.get(f"/v1/responses/{response_id}")
    _check(doc, "/v1/responses/{response_id}", "get", missing.json(), "404")
    bad = live.client.post("/v1/responses", json={"model": MODEL, "input": "x", "temperature": "hot"})
    _check(doc, "/v1/responses", "post", bad.json(), "400")
    streamed = live.client.post("/v1/responses", json={"model": MODEL, "input": "hello", "stream": True})
    last = json.loads(streamed.text.split("\n\n")[-2].split("\n")[1].removeprefix("data: "))
    _validator(doc, "ResponseObject").validate(last["response"])
