"""Server-sent events of an OpenAI streaming response, line by line.

`SSEDecoder` turns text lines into event payloads; `parse_chunk` turns one payload into what the
load generator needs (has it content, usage, a finish reason, an error).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE = "[DONE]"


class SSEDecoder:
    """Incremental SSE decoder: feed lines, get the data of each complete event.

    Follows the SSE rules that matter here: `data:` lines of one event are joined with newlines,
    a blank line ends the event, lines starting with `:` are comments, other fields are ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        """Take one line (without its newline); return an event's data when the line ends one."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        return None

    def flush(self) -> str | None:
        """The last event when the stream ended without a blank line after it."""
        return self._dispatch()

    def _dispatch(self) -> str | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data


class ChunkError(ValueError):
    """A payload that is not a valid chunk, or an error event sent inside the stream."""


@dataclass(frozen=True)
class Chunk:
    """The parts of one streamed chunk that the measurements use."""

    has_content: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


def parse_chunk(data: str) -> Chunk:
    """Interpret one event payload (not `[DONE]`) of a chat or completion stream.

    Content is any non-empty `delta.content` (chat), `delta.reasoning_content` (peers that stream
    reasoning separately; those are output tokens too) or `text` (completions). A role-only first
    delta has no content, so it does not count towards TTFT.
    """
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ChunkError(f"chunk is not JSON: {data[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise ChunkError(f"chunk is not a JSON object: {data[:200]!r}")
    if "error" in obj:
        raise ChunkError(f"error event in stream: {json.dumps(obj['error'])[:500]}")
    has_content = False
    finish_reason = None
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise ChunkError("choices is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise ChunkError("a choice is not an object")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("content") or delta.get("reasoning_content"):
                has_content = True
        if choice.get("text"):
            has_content = True
        if choice.get("finish_reason"):
            finish_reason = str(choice["finish_reason"])
    prompt_tokens = completion_tokens = None
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            completion_tokens = usage["completion_tokens"]
    return Chunk(
        has_content=has_content,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
    )
