"""OpenAI response bodies and stream chunks, for chat and (legacy) completions.

A formatter belongs to one HTTP request. Stream chunks share a constant head (`id`, `object`,
`created`, `model`, `system_fingerprint`) that is serialized once; each chunk only serializes its
choices. The per-token chunk (new text, no logprobs, no finish reason) serializes only the text:
the bytes around it are built once per choice. Chunks are returned as complete SSE events
(`data: ...\\n\\n`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _encode_basestring
from typing import Any

from weir.engine.output import RequestOutput, TokenLogprob
from weir.gateway.api.protocol import Endpoint
from weir.gateway.api.tool_calls import ParsedCall, ToolCallParser, ToolsRequest, split_answer, split_output
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import WeirError

# JSON has no -Infinity; OpenAI reports impossible tokens with this floor.
_LOGPROB_FLOOR = -9999.0
SSE_DONE = b"data: [DONE]\n\n"


# Characters str.splitlines() (and so httpx's `aiter_lines`, which guidellm and many SSE clients
# read streams with) takes for line breaks that JSON leaves raw: written raw inside a `data:`
# line they cut the event in two (JSONDecodeError in the client). JSON escapes all the others
# (\n, \r, \x0b, \x0c, \x1c-\x1e are below 0x20).
_LINE_BREAKS_JSON_LEAVES_RAW = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _dumps(obj: Any) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.translate(_LINE_BREAKS_JSON_LEAVES_RAW)


def _dumps_str(text: str) -> bytes:
    """`_dumps(text).encode()` for a string, without the encoder object `json.dumps` builds per call
    (what `json.dumps` runs for a str with `ensure_ascii=False`; the line breaks it leaves raw are
    all outside ASCII)."""
    quoted = _encode_basestring(text)
    if not text.isascii():
        quoted = quoted.translate(_LINE_BREAKS_JSON_LEAVES_RAW)
    return quoted.encode()


def json_string(text: str) -> bytes:
    """`text` as a JSON string literal in UTF-8, line breaks escaped as in every SSE event here."""
    return _dumps_str(text)


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else _LOGPROB_FLOOR


def sse_event(data: str) -> bytes:
    """One server-sent event carrying `data`."""
    return b"data: " + data.encode() + b"\n\n"


def named_sse_event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event named `name` (Anthropic's and the Responses API's streams)."""
    return b"event: " + name.encode() + b"\ndata: " + _dumps(data).encode() + b"\n\n"


def sse_error(error: WeirError) -> bytes:
    """The event OpenAI sends when a stream fails after it started; its clients raise on it."""
    return sse_event(_dumps(error.body()))


@dataclass
class ChoiceState:
    """Everything one choice produced so far (non-streaming responses keep it all)."""

    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class ResponseFormatter:
    """Builds the bodies of one request; subclasses give the endpoint's shapes."""

    endpoint: Endpoint
    stream_end = SSE_DONE  # after the stream's last event

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        fingerprint: str,
        token_text: Callable[[int], str],
        *,
        logprobs: bool = False,
        include_usage: bool = False,
        tools: ToolsRequest | None = None,
    ) -> None:
        self.response_id = response_id
        self.tools = tools  # chat only: answers are parsed for tool calls
        self.created = created
        self.model = model
        self.fingerprint = fingerprint
        self.token_text = token_text
        self.logprobs = logprobs
        self.include_usage = include_usage
        head = {
            "id": response_id,
            "object": self.endpoint.value + ("" if self.endpoint is Endpoint.COMPLETIONS else ".chunk"),
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        # `{...head...,"choices":` + choices + tail: the head is serialized once per request.
        self._chunk_head = b"data: " + _dumps(head)[:-1].encode() + b',"choices":'
        self._chunk_tail = (b',"usage":null}' if include_usage else b"}") + b"\n\n"
        self._text_parts: dict[int, tuple[bytes, bytes]] = {}  # per choice, for `_text_chunk`

    def error_body(self, error: WeirError) -> dict[str, Any]:
        """The body of an error answered before the first byte of a stream or answer."""
        return error.body()

    def error_event(self, error: WeirError) -> bytes:
        """The event of an error after a stream started."""
        return sse_error(error)

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        return self._chunk_head + _dumps(choices).encode() + self._chunk_tail

    def _text_chunk(self, choice: int, text: str) -> bytes:
        """The chunk of one choice's new text, with no logprobs and no finish reason: the per-token
        case. Byte for byte `_chunk` of the endpoint's choice dict, but only the text is serialized:
        the rest (head, the choice's index and null fields, tail) is built once per choice."""
        parts = self._text_parts.get(choice)
        if parts is None:
            parts = self._text_parts[choice] = self._text_chunk_parts(choice)
        return parts[0] + _dumps_str(text) + parts[1]

    def _text_chunk_parts(self, choice: int) -> tuple[bytes, bytes]:
        """What goes before and after the serialized text in `_text_chunk`."""
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> bytes:
        """The last chunk when `stream_options.include_usage`: no choices, the whole usage."""
        return self._chunk_head + b'[],"usage":' + _dumps(usage.to_openai()).encode() + b"}\n\n"

    def start_chunks(self, num_choices: int) -> list[bytes]:
        """Chunks sent before the first token."""
        return []

    async def seal(self, choices: Sequence[ChoiceState] | None, usage: Usage) -> None:
        """Called once a request completed, before its last bytes (the whole body, with its
        `choices`; or a stream's tail, with None): what the endpoint does with a finished answer
        (`/v1/responses` stores it). Nothing by default."""

    def output_chunks(self, choice: int, out: RequestOutput) -> list[bytes]:
        """Chunks for one engine output of choice `choice`."""
        raise NotImplementedError

    def response(self, choices: Sequence[ChoiceState], usage: Usage) -> dict[str, Any]:
        """The whole non-streaming body."""
        raise NotImplementedError

    def _full(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": self.endpoint.value,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": usage.to_openai(),
        }


class ChatFormatter(ResponseFormatter):
    """`chat.completion` and `chat.completion.chunk` shapes."""

    endpoint = Endpoint.CHAT

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode())}

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        content = []
        for lp in logprobs:
            entry = self._entry(lp.token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in lp.top]
            content.append(entry)
        return {"content": content, "refusal": None}

    def start_chunks(self, num_choices: int) -> list[bytes]:
        # OpenAI opens every choice with the role and empty content.
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(num_choices)
                ]
            )
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsers: dict[int, ToolCallParser] = {}  # per streamed choice, with tools

    def _parser(self, choice: int) -> ToolCallParser | None:
        if self.tools is None:
            return None
        parser = self._parsers.get(choice)
        if parser is None:
            parser = self._parsers[choice] = ToolCallParser(self.tools)
        return parser

    def _call_chunks(self, choice: int, calls: Sequence[ParsedCall]) -> list[bytes]:
        """Streamed calls as OpenAI sends them: id, type and name first, then the arguments."""
        chunks = []
        for i, call in enumerate(calls):
            head = {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            body = {"index": i, "function": {"arguments": call.arguments}}
            for delta in (head, body):
                chunks.append(
                    self._chunk(
                        [
                            {
                                "index": choice,
                                "delta": {"tool_calls": [delta]},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
        return chunks

    def output_chunks(self, choice: int, out: RequestOutput) -> list[bytes]:
        chunks = []
        text, calls = split_output(self._parser(choice), out.new_text, out.finished)
        logprobs = self._logprobs(out.new_logprobs) if self.logprobs and out.new_logprobs else None
        if logprobs is None:
            if text:
                chunks.append(self._text_chunk(choice, text))
        else:
            chunks.append(
                self._chunk(
                    [
                        {
                            "index": choice,
                            "delta": {"content": text},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ]
                )
            )
        chunks += self._call_chunks(choice, calls)
        if out.finished:
            reason = out.finish_reason.value if out.finish_reason else "stop"
            if calls and reason == "stop":
                reason = "tool_calls"
            chunks.append(
                self._chunk([{"index": choice, "delta": {}, "logprobs": None, "finish_reason": reason}])
            )
        return chunks

    def _text_chunk_parts(self, choice: int) -> tuple[bytes, bytes]:
        return (
            self._chunk_head + b'[{"index":%d,"delta":{"content":' % choice,
            b'},"logprobs":null,"finish_reason":null}]' + self._chunk_tail,
        )

    def _message(self, state: ChoiceState) -> tuple[dict[str, Any], str | None]:
        """A choice's message and finish reason; with tools, its calls parsed out of the text."""
        reason = state.finish_reason
        if self.tools is None:
            return {"role": "assistant", "content": state.text, "refusal": None}, reason
        content, calls = split_answer(self.tools, state.text)
        message: dict[str, Any] = {"role": "assistant", "content": content or None, "refusal": None}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
            if reason == "stop":
                reason = "tool_calls"
        else:
            message["content"] = content
        return message, reason

    def response(self, choices: Sequence[ChoiceState], usage: Usage) -> dict[str, Any]:
        entries = []
        for i, c in enumerate(choices):
            message, reason = self._message(c)
            entries.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self._logprobs(c.logprobs) if self.logprobs else None,
                    "finish_reason": reason,
                }
            )
        return self._full(entries, usage)


class CompletionFormatter(ResponseFormatter):
    """`text_completion` shapes (streamed chunks use the same object name)."""

    endpoint = Endpoint.COMPLETIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._text_offset: dict[int, int] = {}  # per choice, for streamed logprobs.text_offset

    def _logprobs(self, logprobs: Sequence[TokenLogprob], start_offset: int) -> dict[str, Any]:
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = start_offset
        for lp in logprobs:
            text = self.token_text(lp.token_id)
            tokens.append(text)
            token_logprobs.append(_logprob(lp.logprob))
            top.append({self.token_text(t): _logprob(v) for t, v in lp.top})
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def output_chunks(self, choice: int, out: RequestOutput) -> list[bytes]:
        logprobs = None
        if self.logprobs and out.new_logprobs:
            logprobs = self._logprobs(out.new_logprobs, self._text_offset.get(choice, 0))
            self._text_offset[choice] = self._text_offset.get(choice, 0) + len(out.new_text)
        if logprobs is None and not out.finished:
            return [self._text_chunk(choice, out.new_text)] if out.new_text else []
        reason = (out.finish_reason.value if out.finish_reason else "stop") if out.finished else None
        return [
            self._chunk(
                [{"text": out.new_text, "index": choice, "logprobs": logprobs, "finish_reason": reason}]
            )
        ]

    def _text_chunk_parts(self, choice: int) -> tuple[bytes, bytes]:
        return (
            self._chunk_head + b'[{"text":',
            b',"index":%d,"logprobs":null,"finish_reason":null}]' % choice + self._chunk_tail,
        )

    def response(self, choices: Sequence[ChoiceState], usage: Usage) -> dict[str, Any]:
        return self._full(
            [
                {
                    "text": c.text,
                    "index": i,
                    "logprobs": self._logprobs(c.logprobs, 0) if self.logprobs else None,
                    "finish_reason": c.finish_reason,
                }
                for i, c in enumerate(choices)
            ],
            usage,
        )


def encode_json(body: dict[str, Any]) -> bytes:
    """A response body as compact UTF-8 JSON."""
    return _dumps(body).encode()
