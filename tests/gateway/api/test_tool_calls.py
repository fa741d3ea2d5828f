"""Tool calling in the gateway: the tool fields, the calls grammar, the parser of answers."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from weir.gateway.api.protocol import Role, parse_chat_request
from weir.gateway.api.structured_bodies import parse_tool_fields
from weir.gateway.api.tool_calls import ToolCallParser, ToolChoiceMode, calls_schema, tools_request
from weir.gateway.http.errors import BadRequestError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NOARGS = {"type": "function", "function": {"name": "ping"}}


def _req(**fields: Any) -> Any:
    return tools_request(parse_tool_fields({"tools": [WEATHER, NOARGS], **fields}))


def test_tool_choice_modes() -> None:
    assert _req().mode is ToolChoiceMode.AUTO
    assert _req(tool_choice="required").mode is ToolChoiceMode.REQUIRED
    named = _req(tool_choice={"type": "function", "function": {"name": "ping"}})
    assert named.mode is ToolChoiceMode.NAMED and [f.name for f in named.offered()] == ["ping"]
    assert _req(tool_choice="none") is None
    with pytest.raises(BadRequestError) as info:
        _req(tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.param == "tool_choice.function.name"


def test_the_calls_schema_admits_valid_calls_only() -> None:
    schema = calls_schema(_req(tool_choice="required", parallel_tool_calls=False))
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Rome"}}], schema)
    jsonschema.validate([{"name": "ping", "arguments": {}}], schema)
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "x", "arguments": {}}],
                [{"name": "ping", "arguments": {}}] * 2):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_the_constrained_parser_reads_the_array() -> None:
    parser = ToolCallParser(_req(tool_choice="required"))
    unclosed = '[{"name": "get_weather", "arguments": {"city": "Rome"}}'  # cut by max_tokens
    assert parser.feed(unclosed) == ""
    content, calls = parser.finish()
    assert content == unclosed and calls == []  # no calls: the text is the content
    parser = ToolCallParser(_req(tool_choice="required"))
    parser.feed('[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "ping", "arguments": {}}]')
    content, calls = parser.finish()
    assert [c.name for c in calls] == ["get_weather", "ping"]
    assert json.loads(calls[0].arguments) == {"city": "Rome"} and calls[0].id.startswith("call_")


def test_the_auto_parser_streams_text_and_holds_back_what_may_be_a_call() -> None:
    parser = ToolCallParser(_req())
    streamed = ""
    text = 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    for i in range(0, len(text), 3):  # a few characters at a time, as tokens arrive
        streamed += parser.feed(text[i : i + 3])
    content, calls = parser.finish()
    assert (streamed + content).strip() == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize(
    "text", ["a < b and <tool", "<tool_call>not json</tool_call>", 'x <tool_call>{"name": "rm"}']
)
def test_text_that_is_no_valid_call_stays_content(text: str) -> None:
    parser = ToolCallParser(_req())
    content = parser.feed(text)
    rest, calls = parser.finish()
    assert calls == [] and content + rest == text


def test_a_conversation_with_calls_renders_them_into_the_prompt() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
    }  # fmt: skip
    chat = parse_chat_request(body)
    messages = chat.prompt_messages()
    assert messages[0].role is Role.SYSTEM and "get_weather" in messages[0].content
    assistant = messages[2].to_template()
    assert (
        assistant["content"]
        == '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    assert messages[3].to_template() == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
