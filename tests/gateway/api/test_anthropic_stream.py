"""Anthropic's message, event stream, usage and error shapes (`weir.gateway.api.anthropic_stream`)."""

from __future__ import annotations

import json
from typing import Any

from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason
from weir.gateway.api.anthropic_stream import AnthropicFormatter
from weir.gateway.api.responses import ChoiceState
from weir.gateway.api.structured_bodies import FunctionDefinition
from weir.gateway.api.tool_calls import ToolChoiceMode, ToolsRequest
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import BadRequestError, ServiceUnavailableError

TOOLS = ToolsRequest(
    (FunctionDefinition(name="get_weather", parameters={"type": "object"}),), ToolChoiceMode.AUTO
)


def events(chunks: list[bytes] | bytes) -> list[tuple[str, dict[str, Any]]]:
    data = b"".join(chunks) if isinstance(chunks, list) else chunks
    out = []
    for raw in data.split(b"\n\n")[:-1]:
        name, body = raw.split(b"\n")
        assert name.startswith(b"event: ") and body.startswith(b"data: ")
        parsed = json.loads(body[len(b"data: ") :])
        assert parsed["type"] == name[len(b"event: ") :].decode()
        out.append((parsed["type"], parsed))
    return out


def out(
    text: str, finished: bool = False, reason: FinishReason | None = None, stop: str | None = None
) -> RequestOutput:
    return RequestOutput("r", 0, (1,), text, finished, reason, stop_reason=stop)


def formatter(tools: ToolsRequest | None = None) -> AnthropicFormatter:
    return AnthropicFormatter("msg_1", 100, "m", "fp", str, tools=tools, input_tokens=9)


def test_text_stream_is_anthropics_event_sequence() -> None:
    f = formatter()
    assert f.include_usage and f.stream_end == b""
    chunks = (
        f.start_chunks(1)
        + f.output_chunks(0, out("Hel"))
        + f.output_chunks(0, out("lo", True, FinishReason.LENGTH))
    )
    tail = f.usage_chunk(Usage(9, 2, 4))
    seq = events(chunks) + events(tail)
    assert [kind for kind, _ in seq] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    start = seq[0][1]["message"]
    assert start["id"] == "msg_1" and start["content"] == [] and start["usage"]["input_tokens"] == 9
    assert [e["delta"]["text"] for k, e in seq if k == "content_block_delta"] == ["Hel", "lo"]
    delta = seq[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 2,
    }  # fmt: skip


def test_stop_sequence_is_named() -> None:
    f = formatter()
    f.output_chunks(0, out("x", True, FinishReason.STOP, stop="END"))
    assert events(f.usage_chunk(Usage(1, 1)))[0][1]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
    }
    state = ChoiceState(["x"], finish_reason="stop", stop_reason="END")
    body = formatter().response([state], Usage(1, 1))
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    state = ChoiceState(["x"], finish_reason="stop")
    assert formatter().response([state], Usage(1, 1))["stop_reason"] == "end_turn"


def test_tool_call_is_a_tool_use_block_streamed_and_not() -> None:
    text = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    f = formatter(TOOLS)
    seq = events(f.output_chunks(0, out(text, True, FinishReason.STOP)) + [f.usage_chunk(Usage(3, 5))])
    blocks = [e["content_block"] for k, e in seq if k == "content_block_start"]
    assert blocks[0] == {"type": "text", "text": ""}
    assert blocks[1]["type"] == "tool_use" and blocks[1]["name"] == "get_weather" and blocks[1]["input"] == {}
    (partial,) = [e["delta"] for k, e in seq if k == "content_block_delta" and e["index"] == 1]
    assert partial["type"] == "input_json_delta" and json.loads(partial["partial_json"]) == {"city": "Paris"}
    assert seq[-2][1]["delta"]["stop_reason"] == "tool_use"
    body = formatter(TOOLS).response([ChoiceState([text], finish_reason="stop")], Usage(3, 5))
    assert body["content"][0] == {"type": "text", "text": "Sure."}
    assert body["content"][1]["input"] == {"city": "Paris"} and body["content"][1]["id"].startswith("call_")
    assert body["stop_reason"] == "tool_use"


def test_errors_are_anthropic_shaped() -> None:
    f = formatter()
    error = BadRequestError("'max_tokens' is required", param="max_tokens", code="missing_required_parameter")
    assert f.error_body(error) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error", "message": "'max_tokens' is required",
            "param": "max_tokens", "code": "missing_required_parameter",
        },
    }  # fmt: skip
    ((kind, body),) = events(f.error_event(ServiceUnavailableError("busy")))
    assert kind == "error" and body["error"]["type"] == "overloaded_error"
    # A message that does not name its field is led by it.
    named = f.error_body(BadRequestError("too long", param="messages"))
    assert named["error"]["message"] == "messages: too long"
