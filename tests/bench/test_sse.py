"""weir_bench.sse: the SSE decoder and chunk parsing."""

from __future__ import annotations

import json

import pytest

from weir_bench.sse import DONE, ChunkError, SSEDecoder, parse_chunk


def feed_all(lines: list[str]) -> list[str]:
    dec = SSEDecoder()
    out = [d for line in lines if (d := dec.feed(line)) is not None]
    tail = dec.flush()
    return out + ([tail] if tail is not None else [])


def test_decoder_events_comments_multiline_and_tail() -> None:
    lines = [": keep-alive", "", "event: message", 'data: {"a":', "data:1}", "", "id: 3", "data: [DONE]"]
    assert feed_all(lines) == ['{"a":\n1}', DONE]
    assert feed_all(["", "", "retry: 5", ""]) == []


def chat(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
    obj: dict = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        obj = {"choices": [], "usage": usage}
    return json.dumps(obj)


def test_content_role_usage_and_finish() -> None:
    assert not parse_chunk(chat({"role": "assistant", "content": ""})).has_content
    assert parse_chunk(chat({"content": "hi"})).has_content
    assert parse_chunk(chat({"reasoning_content": "hmm"})).has_content
    assert parse_chunk(json.dumps({"choices": [{"text": "x", "finish_reason": None}]})).has_content
    end = parse_chunk(chat({}, finish="length"))
    assert end.finish_reason == "length" and not end.has_content
    usage = parse_chunk(chat({}, usage={"prompt_tokens": 5, "completion_tokens": 9}))
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 9)


@pytest.mark.parametrize(
    "data", ["{not json", "[1, 2]", json.dumps({"error": {"message": "boom"}}), json.dumps({"choices": 3})]
)
def test_bad_chunks_raise(data: str) -> None:
    with pytest.raises(ChunkError):
        parse_chunk(data)
