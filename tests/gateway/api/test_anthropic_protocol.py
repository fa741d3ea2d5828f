"""A Messages body as the chat route's request (`weir.gateway.api.anthropic_protocol`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from weir.gateway.api.anthropic_protocol import parse_messages_request
from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.tool_calls import ToolChoiceMode
from weir.gateway.http.errors import BadRequestError

WEATHER = {"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_plain_body_is_a_chat() -> None:
    req = parse_messages_request(
        body(
            system=[{"type": "text", "text": "be brief"}],
            stop_sequences=["\n"],
            top_k=5,
            metadata={"user_id": "u1"},
        )
    )
    assert [(m.role, m.content) for m in req.messages] == [(Role.SYSTEM, "be brief"), (Role.USER, "hi")]
    options = req.options
    assert options.max_tokens == 8 and options.include_usage and options.user == "u1"
    params = options.sampling_params(8)
    assert params.temperature == 1.0 and params.top_k == 5 and params.stop == ("\n",)
    assert req.tools is None and options.constraint is None


def test_tool_use_and_tool_result_become_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "18C"}],
                },
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    req = parse_messages_request(body(messages=messages, tools=[WEATHER]))
    roles = [m.role for m in req.messages]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    call = req.messages[1].tool_calls[0]
    assert call.id == "toolu_1" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert req.messages[2].tool_call_id == "toolu_1" and req.messages[2].content == "18C"
    assert req.tools is not None and req.tools.mode is ToolChoiceMode.AUTO
    assert "get_weather" in req.prompt_messages()[0].content  # the tools are offered in a system message


@pytest.mark.parametrize(
    ("choice", "mode", "parallel"),
    [
        ({"type": "auto"}, ToolChoiceMode.AUTO, True),
        ({"type": "any", "disable_parallel_tool_use": True}, ToolChoiceMode.REQUIRED, False),
        ({"type": "tool", "name": "get_weather"}, ToolChoiceMode.NAMED, True),
    ],
)
def test_tool_choice(choice: dict[str, Any], mode: ToolChoiceMode, parallel: bool) -> None:
    req = parse_messages_request(body(tools=[WEATHER], tool_choice=choice))
    assert req.tools is not None and req.tools.mode is mode and req.tools.parallel is parallel
    assert (req.options.constraint is not None) is (mode is not ToolChoiceMode.AUTO)
    assert parse_messages_request(body(tools=[WEATHER], tool_choice={"type": "none"})).tools is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"temperature": 2}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop_sequences": [""]}, "stop_sequences[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]},
         "messages[0].content[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
        ({"tools": [{"name": "bad name!", "input_schema": {}}]}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}] * 5000}, "messages"),
    ],
)  # fmt: skip
def test_bad_fields_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_messages_request({k: v for k, v in body(**fields).items() if v is not None})
    assert info.value.param == param and info.value.status_code == 400
