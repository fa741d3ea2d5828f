"""`/v1/responses` end to end through the official openai SDK: SmolLM2-135M-Instruct behind a real
server (uvicorn on 127.0.0.1, the real engine on CPU), its responses stored in the tenancy
database (SQLite) per tenant, as `weir serve` keeps them.

Plain and streamed answers (the same text), `text.format` json_schema (the answer validates),
a function call and its `function_call_output` round trip, a three-turn conversation through
`previous_response_id` whose later turns read the earlier ones from the prefix cache, stored
responses got, listed and deleted, another tenant's id answered 404, and hostile bodies 4xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.real_engine_server import RealServer, serve_engine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.request import Priority
from weir.gateway.http.errors import AuthenticationError
from weir.migrations.migrate import upgrade
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.responses.response_repo import DatabaseResponseStore
from weir.tenancy.store.db import Database

pytestmark = pytest.mark.slow

MODEL = "smollm2"
KEYS = {"key-acme": "acme", "key-globex": "globex"}
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


async def _authenticate(authorization: str | None, client_addr: str) -> TenantContext:
    key = (authorization or "").removeprefix("Bearer ")
    if key not in KEYS:
        raise AuthenticationError("invalid API key")
    name = KEYS[key]
    return TenantContext(name, key, Priority.STANDARD, 1.0, name, QuotaLimits())


@pytest.fixture(scope="module")
def real(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('responses') / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"test-pepper"))
    for name in KEYS.values():
        repo.create_tenant(TenantSpec(name=name), actor="test")
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=512, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=2048),
    )
    store = DatabaseResponseStore(db)
    with serve_engine(config, MODEL, authenticate=_authenticate, response_store=store) as served:
        yield served
    db.dispose()


def _client(real: RealServer, key: str = "key-acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=real.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture
def client(real: RealServer) -> Iterator[openai.OpenAI]:
    with _client(real) as c:
        yield c


def test_plain_and_streamed_answers_agree(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": "What is the capital of France?",
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = client.responses.create(**kwargs)
    assert whole.id.startswith("resp_") and whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.usage is not None and 0 < whole.usage.output_tokens <= 16
    events = list(client.responses.create(stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert deltas == whole.output_text
    if whole.status == "completed":
        with client.responses.stream(**kwargs) as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            assert text == stream.get_final_response().output_text == whole.output_text


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Answer(BaseModel):
    city: City
    population_millions: int


def test_text_format_json_schema_validates(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=MODEL,
        input="Name a large city, its country and its population in millions, as JSON.",
        text_format=Answer,
        max_output_tokens=96,
        temperature=0,
    )
    assert parsed.status == "completed", parsed.output_text
    assert isinstance(parsed.output_parsed, Answer)
    jsonschema.validate(json.loads(parsed.output_text), Answer.model_json_schema())
    assert (
        parsed.text is not None
        and parsed.text.format is not None
        and parsed.text.format.type == "json_schema"
    )


def test_function_call_and_its_output_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris, in celsius?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])  # type: ignore[union-attr]
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}],  # type: ignore[union-attr]
        tools=[WEATHER],
        max_output_tokens=24,
        temperature=0,
    )
    assert answer.output and answer.usage is not None and answer.usage.output_tokens > 0
    listed = client.responses.input_items.list(answer.id, order="asc").data
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]


def test_three_turns_read_the_earlier_ones_from_the_prefix_cache(client: openai.OpenAI) -> None:
    turns = ["My name is Ada and I like tea.", "What do I like to drink?", "What is my name?"]
    previous: str | None = None
    cached = []
    for text in turns:
        r = client.responses.create(
            model=MODEL,
            instructions=INSTRUCTIONS,
            input=text,
            previous_response_id=previous,
            max_output_tokens=12,
            temperature=0,
        )
        assert r.usage is not None
        cached.append(r.usage.input_tokens_details.cached_tokens)
        previous = r.id
    assert cached[1] > 0 and cached[2] > cached[1], cached
    assert previous is not None
    items = client.responses.input_items.list(previous, order="asc").data
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant", "user"]  # type: ignore[union-attr]


def test_stored_responses_are_the_tenants_own(client: openai.OpenAI, real: RealServer) -> None:
    r = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    with _client(real, "key-globex") as other:
        for call in (
            lambda: other.responses.retrieve(r.id),
            lambda: other.responses.input_items.list(r.id),
            lambda: other.responses.delete(r.id),
            lambda: other.responses.create(
                model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=2
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        unknown = httpx.get(
            real.url + "/v1/responses/resp_unknown", headers={"authorization": "Bearer key-globex"}
        )
        theirs = httpx.get(real.url + f"/v1/responses/{r.id}", headers={"authorization": "Bearer key-globex"})
        assert unknown.status_code == theirs.status_code == 404
        assert unknown.json()["error"]["code"] == theirs.json()["error"]["code"]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": [{"role": "user", "content": "hi"}] * 100_000}, "input"),
        ({"input": "hi", "tools": [{"type": "web_search_preview"}]}, "tools"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "max_output_tokens": 2048}, "input"),
        ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "hi", "previous_response_id": "resp_" + "0" * 32}, "previous_response_id"),
        ({"input": "hi", "model": "no-such-model"}, "model"),
        (
            {
                "input": "hi",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"$ref": "#/$defs/a"}},
                            "$defs": {"a": {"$ref": "#/$defs/a"}},
                        },
                    }
                },
            },
            "text.format.schema",
        ),
    ],
)
def test_hostile_bodies_are_refused_naming_the_field(
    real: RealServer, body: dict[str, Any], field: str
) -> None:
    full = {"model": MODEL, **body}
    r = httpx.post(
        real.url + "/v1/responses", json=full, headers={"authorization": "Bearer key-acme"}, timeout=60
    )
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == field, r.text
