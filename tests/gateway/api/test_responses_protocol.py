"""A Responses body as the chat route's request: items to messages, tools, formats, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.responses_protocol import (
    drop_oldest,
    output_as_items,
    parse_responses_request,
    validate_items,
)
from weir.gateway.http.errors import BadRequestError

BASE = {"model": "m"}


def _parse(**fields: Any) -> Any:
    return parse_responses_request({**BASE, **fields}, 64)


def test_a_string_input_is_one_user_message_behind_the_instructions() -> None:
    parsed = _parse(input="hi", instructions="be brief")
    assert parsed.items == (
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    )
    chat = parsed.chat(parsed.items)
    assert [(m.role, m.content) for m in chat.messages] == [(Role.SYSTEM, "be brief"), (Role.USER, "hi")]
    assert chat.options.sampling["temperature"] == 1.0 and chat.options.include_usage


def test_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "let me look", "annotations": []}],
            "id": "msg_1",
            "status": "completed",
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}', "id": "fc_1"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]
    parsed = _parse(input=items)
    messages = parsed.chat(parsed.items).messages
    assert [m.role for m in messages] == [Role.DEVELOPER, Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL]
    assert messages[1].content == "ab"
    assistant = messages[2]
    assert assistant.content == "let me look" and [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert "<tool_call>" in assistant.to_template()["content"]  # rendered for templates without tools
    assert (messages[3].tool_call_id, messages[3].content, messages[4].content) == ("c1", "one", "two")
    # The stored form validates again as input, and means the same conversation.
    again = parsed.chat(list(parsed.items)).messages
    assert again == messages
    assert "id" not in parsed.items[2] and "status" not in parsed.items[3]


def test_a_stored_answer_reads_back_as_assistant_items() -> None:
    output = [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "call_id": "c",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
        },
    ]
    items = output_as_items(output)
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert len(validate_items(items, "previous_response_id")) == 2


def test_dropping_the_oldest_items_drops_orphaned_call_outputs() -> None:
    items = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"type": "message", "role": "user", "content": "y"},
    ]
    assert drop_oldest(items, 1) == [items[2]]
    assert drop_oldest(items, 0) == items


def test_tools_and_formats() -> None:
    tool = {
        "type": "function",
        "name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    parsed = _parse(input="x", tools=[tool], tool_choice="required")
    assert parsed.tools is not None and parsed.tools.constrained and parsed.options.constraint is not None
    assert parsed.options.constraint.param == "tools"
    named = _parse(input="x", tools=[tool], tool_choice={"type": "function", "name": "f"})
    assert named.tools is not None and named.tools.named == "f"
    assert _parse(input="x", tools=[tool], tool_choice="none").tools is None
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = _parse(
        input="x", text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}}
    )
    assert fmt.options.constraint is not None and fmt.options.constraint.param == "text.format.schema"
    assert _parse(input="x", text={"format": {"type": "json_object"}}).options.constraint is not None
    assert _parse(input="x", text={"format": {"type": "text"}}).options.constraint is None
    with pytest.raises(BadRequestError) as info:
        _parse(input="x", tools=[tool], tool_choice="required", text={"format": {"type": "json_object"}})
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"input": "x", "unknown_field": 1}, "unknown_field", "unsupported_parameter"),
        ({"input": "x", "background": True}, "background", "unsupported_parameter"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools", "unsupported_parameter"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "unsupported_parameter"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        (
            {"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "invalid_value",
        ),
        ({"input": 5}, "input", "invalid_type"),
        ({"input": "x", "top_p": 0}, "top_p", "invalid_value"),
        ({"input": "x", "user": "u" * 300}, "user", "invalid_value"),
    ],
)
def test_bad_fields_are_named(fields: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(BadRequestError) as info:
        _parse(**fields)
    assert (info.value.param, info.value.code) == (param, code)
