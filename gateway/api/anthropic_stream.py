"""Anthropic's answer shapes for `POST /v1/messages`: the message, its stream events, its errors.

The request runs as a chat completion (`weir.gateway.api.anthropic_protocol`); this formatter writes
what the engine produced as Anthropic's SDKs read it:

- a message `{"id": "msg_...", "type": "message", "role": "assistant", "content": [blocks],
  "stop_reason", "stop_sequence", "usage"}`, its blocks `text` and `tool_use` (calls parsed out
  of the text as for chat, `weir.gateway.api.tool_calls`);
- a stream of named events: `message_start`, then per block `content_block_start`,
  `content_block_delta` (`text_delta`, or the call's `input_json_delta`) and
  `content_block_stop`, then `message_delta` (the stop reason and the usage) and `message_stop`;
  no `[DONE]`. An error after the stream started is an `error` event;
- `usage`: `input_tokens` (the prompt tokens not read from the prefix cache),
  `cache_read_input_tokens` (those that were), `cache_creation_input_tokens` (0) and
  `output_tokens`;
- stop reasons: `end_turn`, `stop_sequence` (with the sequence), `max_tokens`, `tool_use`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from weir.engine.output import RequestOutput
from weir.gateway.api.protocol import Endpoint
from weir.gateway.api.responses import ChoiceState, ResponseFormatter, named_sse_event
from weir.gateway.api.tool_calls import ParsedCall, ToolCallParser, split_answer, split_output
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import WeirError, anthropic_error_body

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def anthropic_usage(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _stop(reason: str | None, stop: str | int | None, calls: bool) -> tuple[str, str | None]:
    """Anthropic's stop reason and stop sequence for the engine's finish reason."""
    if calls and reason in (None, "stop"):
        return "tool_use", None
    if reason == "stop" and isinstance(stop, str):
        return "stop_sequence", stop
    return _STOP_REASONS.get(reason or "stop", "end_turn"), None


def _tool_use(call: ParsedCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}


class AnthropicFormatter(ResponseFormatter):
    """Message and event shapes of one `/v1/messages` request (one choice)."""

    endpoint = Endpoint.MESSAGES
    stream_end = b""  # Anthropic's stream ends with message_stop, no [DONE]

    def __init__(self, *args: Any, input_tokens: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.include_usage = True  # the tail (message_delta, message_stop) carries it
        self.input_tokens = input_tokens
        self._parser = ToolCallParser(self.tools) if self.tools is not None else None
        self._block = 0  # index of the next content block
        self._text_open = False
        self._stop: tuple[str, str | None] = ("end_turn", None)

    def error_body(self, error: WeirError) -> dict[str, Any]:
        return anthropic_error_body(error)

    def error_event(self, error: WeirError) -> bytes:
        return named_sse_event("error", anthropic_error_body(error))

    def start_chunks(self, num_choices: int) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [named_sse_event("message_start", {"type": "message_start", "message": message})]

    def _close_text(self) -> list[bytes]:
        if not self._text_open:
            return []
        self._text_open = False
        self._block += 1
        return [
            named_sse_event("content_block_stop", {"type": "content_block_stop", "index": self._block - 1})
        ]

    def _text(self, text: str) -> list[bytes]:
        events = []
        if not self._text_open:
            self._text_open = True
            block = {"type": "text", "text": ""}
            events.append(
                named_sse_event(
                    "content_block_start",
                    {"type": "content_block_start", "index": self._block, "content_block": block},
                )
            )
        delta = {"type": "text_delta", "text": text}
        events.append(
            named_sse_event(
                "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
            )
        )
        return events

    def _call(self, call: ParsedCall) -> list[bytes]:
        index, self._block = self._block, self._block + 1
        start = {**_tool_use(call), "input": {}}
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        return [
            named_sse_event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            ),
            named_sse_event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            ),
            named_sse_event("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]

    def output_chunks(self, choice: int, out: RequestOutput) -> list[bytes]:
        text, calls = split_output(self._parser, out.new_text, out.finished)
        events = self._text(text) if text else []
        if out.finished:
            events += self._close_text()
            for call in calls:
                events += self._call(call)
            reason = out.finish_reason.value if out.finish_reason else None
            self._stop = _stop(reason, out.stop_reason, bool(calls))
        return events

    def usage_chunk(self, usage: Usage) -> bytes:
        """The stream's tail: the stop reason and the usage, then the end of the message."""
        stop_reason, stop_sequence = self._stop
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": anthropic_usage(usage),
        }
        tail = b"".join(self._close_text())  # a stream cut short may leave a block open
        return (
            tail
            + named_sse_event("message_delta", delta)
            + named_sse_event("message_stop", {"type": "message_stop"})
        )

    def response(self, choices: Sequence[ChoiceState], usage: Usage) -> dict[str, Any]:
        (state,) = choices
        text, calls = split_answer(self.tools, state.text)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [_tool_use(call) for call in calls]
        stop_reason, stop_sequence = _stop(state.finish_reason, state.stop_reason, bool(calls))
        return {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": anthropic_usage(usage),
        }
