"""The Responses answer and event shapes (`weir.gateway.api.responses_stream`): items, calls,
sequence numbers, incomplete answers, errors, and the store called before the last bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason
from weir.gateway.api.responses import ChoiceState
from weir.gateway.api.responses_stream import ResponsesFormatter
from weir.gateway.api.structured_bodies import FunctionDefinition
from weir.gateway.api.tool_calls import ToolChoiceMode, ToolsRequest
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import ServiceUnavailableError

TOOLS = ToolsRequest(
    (FunctionDefinition(name="get_weather", parameters={"type": "object"}),), ToolChoiceMode.AUTO
)
USAGE = Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in data.split(b"\n\n")[:-1]:
        name, body = raw.split(b"\n")
        parsed = json.loads(body[len(b"data: ") :])
        assert parsed["type"] == name[len(b"event: ") :].decode()
        out.append(parsed)
    return out


def out(text: str, finished: bool = False, reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput("r", 0, (1,), text, finished, reason)


def formatter(
    tools: ToolsRequest | None = None, stored: list[dict[str, Any]] | None = None
) -> ResponsesFormatter:
    async def store(body: dict[str, Any]) -> None:
        assert stored is not None
        stored.append(body)

    echo = {"instructions": None, "store": stored is not None}
    return ResponsesFormatter(
        "resp_1", 100, "m", "fp", str, tools=tools, echo=echo, store=store if stored is not None else None
    )


def stream(f: ResponsesFormatter, outputs: list[RequestOutput]) -> list[dict[str, Any]]:
    chunks = f.start_chunks(1)
    for o in outputs:
        chunks += f.output_chunks(0, o)
    asyncio.run(f.seal(None, USAGE))
    return events(b"".join(chunks) + f.usage_chunk(USAGE))


def test_text_stream_and_the_stored_response() -> None:
    stored: list[dict[str, Any]] = []
    f = formatter(stored=stored)
    evs = stream(f, [out("Hel"), out("lo", True, FinishReason.STOP)])
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    final = evs[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14,
    }
    assert stored == [final]  # stored before the last event was written
    item_ids = {e["item_id"] for e in evs if "item_id" in e}
    assert item_ids == {final["output"][0]["id"]}


def test_calls_are_items_of_their_own() -> None:
    evs = stream(formatter(TOOLS), [out("Sure. " + CALL, True, FinishReason.STOP)])
    kinds = [e["type"] for e in evs]
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = evs[-1]["response"]["output"][1]
    assert (
        call["type"] == "function_call"
        and call["name"] == "get_weather"
        and call["call_id"].startswith("call_")
    )
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert evs[-1]["response"]["output"][0]["content"][0]["text"].strip() == "Sure."


def test_only_a_call_has_no_message() -> None:
    f = formatter(TOOLS)
    state = ChoiceState([CALL], finish_reason="stop")
    asyncio.run(f.seal([state], USAGE))
    body = f.response([state], USAGE)
    assert [i["type"] for i in body["output"]] == ["function_call"]


def test_max_output_tokens_makes_it_incomplete() -> None:
    evs = stream(formatter(), [out("a", True, FinishReason.LENGTH)])
    final = evs[-1]
    assert final["type"] == "response.incomplete" and final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"


def test_an_empty_answer_is_an_empty_message() -> None:
    evs = stream(formatter(), [out("", True, FinishReason.STOP)])
    assert evs[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_error_event_and_a_failing_store() -> None:
    f = formatter()
    f.start_chunks(1)
    error = events(f.error_event(ServiceUnavailableError("gone", code="shutting_down")))[0]
    assert error == {
        "type": "error",
        "sequence_number": 2,
        "code": "shutting_down",
        "message": "gone",
        "param": None,
    }

    async def broken(body: dict[str, Any]) -> None:
        raise OSError("disk full")

    g = ResponsesFormatter("resp_2", 1, "m", "fp", str, echo={}, store=broken)
    asyncio.run(g.seal([ChoiceState(["x"], finish_reason="stop")], USAGE))  # logged, not raised
    assert g.response([], USAGE)["output"][0]["content"][0]["text"] == "x"


def test_the_per_token_event_is_byte_for_byte_the_generic_one() -> None:
    f = formatter()
    f.start_chunks(1)
    for text in ("plain", 'quo"te \\ back', "naïve \u2028 line", ""):
        (fast,) = [e for e in f.output_chunks(0, out(text or " ")) if b"output_text.delta" in e]
        f._seq -= 1  # the same number again, written by the generic serializer
        slow = f._event(
            "response.output_text.delta",
            output_index=0,
            item_id=f._message_id,
            content_index=0,
            delta=text or " ",
            logprobs=[],
        )
        assert fast == slow
