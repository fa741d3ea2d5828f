"""Structured outputs and tool calls end to end: SmolLM2-135M-Instruct behind a real server.

uvicorn on 127.0.0.1, the real engine (CPU) and the official clients: the openai SDK's
`chat.completions.parse` with a pydantic model, forced tool calls (streamed and not) whose
arguments validate against the function's parameters, vLLM's `structured_outputs`, a tool
conversation round trip, LangChain (`with_structured_output`, `bind_tools`) when installed, and
hostile constraints refused with 400 naming the field while another request's stream completes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.real_engine_server import RealServer, serve_engine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.slow

MODEL = "smollm2"


class Person(BaseModel):
    name: str
    age: int


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PARAMETERS = {"get_weather": WEATHER["function"]["parameters"], "get_time": TIME["function"]["parameters"]}


@pytest.fixture(scope="module")
def real(default_model_dir: Path) -> Iterator[RealServer]:
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=512, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=2048),
    )
    with serve_engine(config, MODEL) as served:
        yield served


@pytest.fixture
def client(real: RealServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real.url + "/v1", api_key="local", max_retries=0, timeout=120) as c:
        yield c


def test_parse_with_a_pydantic_model_returns_a_validated_object(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Ada Lovelace was 36. Give her name and age as JSON."}],
        response_format=Person,
        temperature=0,
        max_tokens=60,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert completion.usage is not None and completion.usage.completion_tokens > 0  # billed as usual


def test_json_object_and_sampled_choices_all_parse(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=3,
        n=3,
        max_tokens=80,
    )
    for choice in completion.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content or ""), dict)


def test_completions_take_response_format_too(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    completion = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer in JSON:",
        max_tokens=20,
        temperature=0,
        extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        },
    )
    jsonschema.validate(json.loads(completion.choices[0].text), schema)


@pytest.mark.parametrize(
    "structured, check",
    [
        ({"choice": ["positive", "negative"]}, lambda t: t in ("positive", "negative")),
        ({"regex": "[0-9]{3}-[0-9]{4}"}, lambda t: len(t) == 8 and t[3] == "-"),
        ({"grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
        ({"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}, None),
    ],
)
def test_vllm_structured_outputs(client: openai.OpenAI, structured: dict[str, Any], check: Any) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "I love this movie! Classify it."}],
        temperature=0,
        max_tokens=30,
        extra_body={"structured_outputs": structured},
    )
    text = completion.choices[0].message.content or ""
    assert completion.choices[0].finish_reason == "stop"
    if check is not None:
        assert check(text), text
    else:
        jsonschema.validate(json.loads(text), structured["json"])


def _check_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def test_required_tool_choice_gives_calls_that_validate(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
    _check_calls([(c.function.name, c.function.arguments) for c in calls], {"get_weather", "get_time"})  # type: ignore[union-attr]


def test_streamed_named_tool_call_arrives_as_openai_streams_it(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert all(c["id"].startswith("call_") for c in calls.values())
    _check_calls([(c["name"], c["arguments"]) for c in calls.values()], {"get_time"})


def test_a_tool_conversation_round_trip_is_accepted(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "unit": "celsius"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_tokens=40,
    )
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls


def test_legacy_functions_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            functions=[WEATHER["function"]],  # type: ignore[list-item]
        )
    assert info.value.body["param"] == "functions"  # type: ignore[index]


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "e", "schema": {"enum": [f"v{i}" for i in range(100_000)]}},
            }
        },
        "response_format.json_schema.schema",
    ),  # fmt: skip
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": _deep(12)}}},
        "response_format.json_schema.schema",
    ),  # fmt: skip
    ({"structured_outputs": {"regex": "[a-z]{1,100000}"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "(a|b)" * 2000}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= root"}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_object"}, "use_beam_search": True, "n": 2}, "response_format"),
]


def test_hostile_constraints_are_refused_naming_the_field_while_another_stream_completes(
    real: RealServer, client: openai.OpenAI
) -> None:
    finished: list[str | None] = []

    def stream_other() -> None:
        with openai.OpenAI(base_url=real.url + "/v1", api_key="other", max_retries=0, timeout=120) as other:
            stream = other.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Count to five."}],
                max_tokens=24,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.finish_reason:
                        finished.append(choice.finish_reason)

    thread = threading.Thread(target=stream_other)
    thread.start()
    for body, param in HOSTILE:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_body=body
            )
        assert info.value.body["param"] == param, body  # type: ignore[index]
    thread.join()
    assert finished == ["length"] or finished == ["stop"]


def test_langchain_structured_output_and_bound_tools(real: RealServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        model=MODEL, base_url=real.url + "/v1", api_key="local", temperature=0, max_tokens=60, max_retries=0
    )
    person = llm.with_structured_output(Person, method="json_schema").invoke("Ada Lovelace was 36.")
    assert isinstance(person, Person)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Rome?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(message.tool_calls[0]["args"], PARAMETERS["get_weather"])


# -- issue 54: nested models, refused keywords, calls that always close ----------------------


class City(BaseModel):
    name: str
    country: str | None = None


class Trip(BaseModel):
    origin: City
    destination: City


TRIP = {
    "type": "function",
    "function": {"name": "plan_trip", "description": "Plan a trip.", "parameters": Trip.model_json_schema()},
}


def test_a_pydantic_nested_model_as_tool_parameters_works_under_required(client: openai.OpenAI) -> None:
    """`$defs` + `$ref` (what pydantic writes) compile inside the calls grammar and hold."""
    assert "$defs" in TRIP["function"]["parameters"]  # type: ignore[index]
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Plan a trip from Paris to Rome."}],
        tools=[TRIP],  # type: ignore[list-item]
        tool_choice="required",
        temperature=1.0,
        seed=5,
        n=3,
        max_tokens=120,
    )
    assert len(completion.choices) == 3
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        for call in choice.message.tool_calls or []:
            assert call.function.name == "plan_trip"  # type: ignore[union-attr]
            jsonschema.validate(json.loads(call.function.arguments), Trip.model_json_schema())  # type: ignore[union-attr]
        assert choice.message.tool_calls


REFUSED_SCHEMAS = [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 8}, "pattern"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "object", "properties": {"c": {"$ref": "http://example.com/city.json"}}}, "$ref"),
]


@pytest.mark.parametrize("schema, keyword", REFUSED_SCHEMAS)
def test_keywords_the_grammar_ignores_are_refused_naming_them(
    client: openai.OpenAI, schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    body = info.value.body
    assert body["param"] == "response_format.json_schema.schema" and keyword in body["message"]  # type: ignore[index]
    parameters = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            tool_choice="auto",
        )
    body = info.value.body
    assert body["param"] == "tools[0].function.parameters" and "$.properties.x" in body["message"]  # type: ignore[index]


def test_required_tool_calls_at_temperature_1_always_end_with_complete_calls(client: openai.OpenAI) -> None:
    """A budget just above the shortest call: the engine closes the array before max_tokens."""
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris, then the time in Tokyo, then more."}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        temperature=1.0,
        seed=11,
        n=5,
        max_tokens=70,
    )
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        calls = choice.message.tool_calls or []
        assert 1 <= len(calls) <= 8
        _check_calls([(c.function.name, c.function.arguments) for c in calls], {"get_weather", "get_time"})  # type: ignore[union-attr]


def test_a_max_tokens_below_the_shortest_call_is_refused_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=5,
        )
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]
