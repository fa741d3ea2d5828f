"""OpenAI's Responses answer shapes for `POST /v1/responses`: the response object and its events.

The request runs as a chat completion (`weir.gateway.api.responses_protocol`); this formatter writes
what the engine produced as the openai SDK's `responses` resource reads it:

- a response `{"id": "resp_...", "object": "response", "status", "output": [items], "usage", ...}`
  whose items are a `message` (one `output_text` part) and the `function_call`s parsed out of the
  text as for chat (`weir.gateway.api.tool_calls`), each with its `call_id`;
- a stream of typed events, each with its `sequence_number` (0, 1, ...): `response.created`,
  `response.in_progress`; for the message `response.output_item.added`,
  `response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
  `response.content_part.done`, `response.output_item.done`; for each call
  `response.output_item.added`, `response.function_call_arguments.delta`/`.done`,
  `response.output_item.done`; then `response.completed` (or `response.incomplete` when
  `max_output_tokens` cut it) with the whole response. An error after the stream started is an
  `error` event; there is no `[DONE]`;
- `usage`: `input_tokens` (the whole prompt), `input_tokens_details.cached_tokens` (those read
  from the prefix cache), `output_tokens`, `output_tokens_details.reasoning_tokens` (0).

Before the answer's last bytes (the whole body, or the last event) the finished response is
handed to `store` (`ResponseFormatter.seal`), which starts its write (in the background for a
database: `weir.gateway.routes.response_writes`), so a client that saw the answer finds it stored.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from weir.engine.output import RequestOutput
from weir.gateway.api.protocol import Endpoint
from weir.gateway.api.responses import ChoiceState, ResponseFormatter, json_string, named_sse_event
from weir.gateway.api.tool_calls import ParsedCall, ToolCallParser, split_answer, split_output
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import WeirError

logger = logging.getLogger(__name__)

Store = Callable[[dict[str, Any]], Awaitable[None]]


def responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def _function_call(call: ParsedCall) -> dict[str, Any]:
    return {
        "id": "fc_" + uuid.uuid4().hex,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


class ResponsesFormatter(ResponseFormatter):
    """Response and event shapes of one `/v1/responses` request (one choice)."""

    endpoint = Endpoint.RESPONSES
    stream_end = b""  # the stream ends with response.completed, no [DONE]

    def __init__(self, *args: Any, echo: dict[str, Any], store: Store | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.echo = echo  # the request's fields the response states (instructions, tools, ...)
        self.store = store
        self._seq = 0
        self._parser = ToolCallParser(self.tools) if self.tools is not None else None
        self._message_id: str | None = None  # the streamed message item, once opened
        # The bytes of the open message's delta event around its sequence number and its text:
        # the per-token event serializes only those two (byte for byte `_event`'s output).
        self._delta_parts: tuple[bytes, bytes, bytes] = (b"", b"", b"")
        self._text: list[str] = []
        self._output: list[dict[str, Any]] = []  # finished output items, streamed
        self._finish_reason: str | None = None
        self._final: dict[str, Any] | None = None

    def body(self, status: str, output: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        """The response object in `status` (`in_progress`, `completed`, `incomplete`)."""
        done = status in ("completed", "incomplete")
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            "usage": responses_usage(usage) if done and usage is not None else None,
            "background": False,
            "service_tier": "default",
            **self.echo,
        }

    def _event(self, kind: str, **data: Any) -> bytes:
        seq, self._seq = self._seq, self._seq + 1
        return named_sse_event(kind, {"type": kind, "sequence_number": seq, **data})

    def error_event(self, error: WeirError) -> bytes:
        return self._event("error", code=error.code, message=error.message, param=error.param)

    def start_chunks(self, num_choices: int) -> list[bytes]:
        created = self.body("in_progress", [], None)
        return [
            self._event("response.created", response=created),
            self._event("response.in_progress", response=created),
        ]

    def _open_message(self) -> list[bytes]:
        self._message_id = "msg_" + uuid.uuid4().hex
        index, item_id = len(self._output), self._message_id
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=_message(item_id, "", "in_progress") | {"content": []},
            ),
            self._event(
                "response.content_part.added", output_index=index, item_id=item_id, content_index=0, part=part
            ),
        ]

    def _delta(self, text: str) -> list[bytes]:
        events = self._open_message() if self._message_id is None else []
        if not self._delta_parts[0]:
            kind = "response.output_text.delta"
            where = {"output_index": len(self._output), "item_id": self._message_id, "content_index": 0}
            fields = json.dumps(where, separators=(",", ":"))[1:-1]
            self._delta_parts = (
                b"event: " + kind.encode() + b'\ndata: {"type":"' + kind.encode() + b'","sequence_number":',
                b"," + fields.encode() + b',"delta":',
                b',"logprobs":[]}\n\n',
            )
        self._text.append(text)
        head, middle, tail = self._delta_parts
        seq, self._seq = self._seq, self._seq + 1
        events.append(head + str(seq).encode() + middle + json_string(text) + tail)
        return events

    def _close_message(self, status: str) -> list[bytes]:
        if self._message_id is None:
            return []
        index, item_id, text = len(self._output), self._message_id, "".join(self._text)
        item = _message(item_id, text, status)
        self._output.append(item)
        self._message_id, self._delta_parts = None, (b"", b"", b"")
        return [
            self._event(
                "response.output_text.done",
                output_index=index,
                item_id=item_id,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                output_index=index,
                item_id=item_id,
                content_index=0,
                part=item["content"][0],
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call(self, call: ParsedCall) -> list[bytes]:
        index, item = len(self._output), _function_call(call)
        self._output.append(item)
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=item | {"arguments": "", "status": "in_progress"},
            ),
            self._event(
                "response.function_call_arguments.delta",
                output_index=index,
                item_id=item["id"],
                delta=call.arguments,
            ),
            self._event(
                "response.function_call_arguments.done",
                output_index=index,
                item_id=item["id"],
                name=call.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def output_chunks(self, choice: int, out: RequestOutput) -> list[bytes]:
        text, calls = split_output(self._parser, out.new_text, out.finished)
        events = self._delta(text) if text else []
        if out.finished:
            self._finish_reason = out.finish_reason.value if out.finish_reason else "stop"
            if not calls and self._message_id is None and not self._output:
                events += self._open_message()  # an empty answer is still a message
            events += self._close_message("incomplete" if self._finish_reason == "length" else "completed")
            for call in calls:
                events += self._call(call)
        return events

    def _whole_output(self, state: ChoiceState) -> list[dict[str, Any]]:
        text, calls = split_answer(self.tools, state.text)
        output = []
        if text or not calls:
            status = "incomplete" if state.finish_reason == "length" else "completed"
            output.append(_message("msg_" + uuid.uuid4().hex, text, status))
        return output + [_function_call(call) for call in calls]

    async def seal(self, choices: Sequence[ChoiceState] | None, usage: Usage) -> None:
        """The finished response, handed to `store` (when asked) before its last bytes are sent
        (the store starts the write; reads of the id wait for it). A store that fails is logged:
        the answer is delivered, and is then not found by id."""
        if choices is not None:
            (state,) = choices
            output, reason = self._whole_output(state), state.finish_reason
        else:
            output, reason = self._output, self._finish_reason
        self._final = self.body("incomplete" if reason == "length" else "completed", output, usage)
        if self.store is not None:
            try:
                await self.store(self._final)
            except Exception:
                logger.exception("could not store the response %s", self.response_id)

    def usage_chunk(self, usage: Usage) -> bytes:
        """The stream's last event: the whole response, completed or incomplete."""
        final = self._final if self._final is not None else self.body("completed", self._output, usage)
        tail = b"".join(self._close_message("incomplete"))  # a stream cut short may leave one open
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return tail + self._event(kind, response=final)

    def response(self, choices: Sequence[ChoiceState], usage: Usage) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        (state,) = choices
        return self.body("completed", self._whole_output(state), usage)
