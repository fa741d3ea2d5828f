"""`POST /v1/messages` end to end through the official `anthropic` SDK: SmolLM2-135M-Instruct
behind a real server (uvicorn on 127.0.0.1, the real engine on CPU).

Plain and streamed answers (the same text, Anthropic's event sequence), stop sequences, usage
with the prefix cache's reads, a tool_use round trip with its tool_result, and hostile bodies
answered 4xx in Anthropic's error shape naming the field. Tenant keys sent as `x-api-key` are
checked on the tenancy server (the fake engine, keys on SQLite).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.e2e.real_engine_server import RealServer, serve_engine
from tests.e2e.tenancy_server import FullServer, serve_everything
from tests.gateway.harness import MODEL as FAKE_MODEL
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

MODEL = "smollm2"
# Greedy decoding (the server reads `temperature`; newer SDKs no longer take it as an argument).
GREEDY = {"temperature": 0}
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def real(default_model_dir: Path) -> Iterator[RealServer]:
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=512, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=2048),
    )
    with serve_engine(config, MODEL) as served:
        yield served


@pytest.fixture
def client(real: RealServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=real.url, api_key="local", max_retries=0, timeout=120) as c:
        yield c


@pytest.mark.slow
def test_plain_message_and_usage(client: anthropic.Anthropic, real: RealServer) -> None:
    m = client.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK, extra_body=GREEDY)  # type: ignore[arg-type]
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text  # type: ignore[union-attr]
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 12
    # The prompt is the chat route's: the template over the system and user messages.
    chat = [{"role": "system", "content": SYSTEM}, *ASK]
    count = httpx.post(real.url + "/tokenize", json={"messages": chat}).json()["count"]
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == count
    # The same prompt again is read from the prefix cache, and says so.
    again = client.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK, extra_body=GREEDY)  # type: ignore[arg-type]
    assert again.usage.cache_read_input_tokens and again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == count
    assert again.content[0].text == m.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow
def test_stream_matches_the_whole_answer(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 16,
        "system": SYSTEM,
        "messages": ASK,
        "extra_body": GREEDY,
    }
    whole = client.messages.create(**kwargs)
    events = list(client.messages.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.slow
def test_stop_sequence(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 16,
        "system": SYSTEM,
        "messages": ASK,
        "extra_body": GREEDY,
    }
    text = client.messages.create(**kwargs).content[0].text  # type: ignore[union-attr]
    word = text.split()[1]
    m = client.messages.create(stop_sequences=[word], **kwargs)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert word not in m.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(client: anthropic.Anthropic, stream: bool) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": ask,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "extra_body": GREEDY,
    }
    if stream:
        with client.messages.stream(**kwargs) as s:
            m = s.get_final_message()
    else:
        m = client.messages.create(**kwargs)
    assert m.stop_reason == "tool_use"
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER["input_schema"])
    # The answer to the call goes back as a tool_result; the model answers in text.
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"}
    conversation: list[dict[str, Any]] = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [result]},
    ]
    round_trip: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 24,
        "tools": [WEATHER],
        "extra_body": GREEDY,
        "messages": conversation,
    }
    answer = client.messages.create(**round_trip)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.output_tokens > 0 and answer.content


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"messages": [{"role": "user", "content": "hi"}] * 100_000}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"stop_sequences": ["x"] * 1000}, "stop_sequences"),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"model": "no-such-model"}, "model"),
        ({"max_tokens": 2040}, "max_tokens"),
    ],
)
def test_hostile_bodies_get_anthropic_errors(real: RealServer, body: dict[str, Any], field: str) -> None:
    full = {"model": MODEL, "max_tokens": 8, "messages": ASK, **body}
    r = httpx.post(real.url + "/v1/messages", json=full, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()
    assert error["type"] == "error" and set(error["error"]) >= {"type", "message"}
    assert error["error"]["type"] in ("invalid_request_error", "not_found_error")
    assert field in error["error"]["message"]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("anthropic")) as served:
        yield served


def test_tenant_key_as_x_api_key(full: FullServer) -> None:
    with anthropic.Anthropic(base_url=full.url, api_key=full.tenant_key, max_retries=0) as c:
        m = c.messages.create(model=FAKE_MODEL, max_tokens=4, messages=ASK)  # type: ignore[arg-type]
        assert m.usage.output_tokens == 4 and m.stop_reason == "max_tokens"
    with anthropic.Anthropic(base_url=full.url, auth_token=full.tenant_key, api_key=None, max_retries=0) as c:
        assert c.messages.create(model=FAKE_MODEL, max_tokens=2, messages=ASK).usage.output_tokens == 2  # type: ignore[arg-type]
    with anthropic.Anthropic(base_url=full.url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError) as info:
            c.messages.create(model=FAKE_MODEL, max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    assert info.value.body["type"] == "error"  # type: ignore[index]
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
