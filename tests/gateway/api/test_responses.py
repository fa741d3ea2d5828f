"""Response shapes and SSE chunk framing, byte for byte."""

from __future__ import annotations

import json

from weir.engine.output import RequestOutput, TokenLogprob
from weir.engine.request import FinishReason
from weir.gateway.api.responses import SSE_DONE, ChatFormatter, ChoiceState, CompletionFormatter, sse_error
from weir.gateway.api.usage import Usage
from weir.gateway.http.errors import ServiceUnavailableError


def names(token_id: int) -> str:
    return {1: "a", 2: "b", 3: "c"}[token_id]


def event(chunk: bytes) -> dict[str, object]:
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n") and chunk.count(b"\n\n") == 1
    return json.loads(chunk[len(b"data: ") : -2])


def out(text: str, finished: bool = False, reason: FinishReason | None = None, **kw: object) -> RequestOutput:
    return RequestOutput("r", 0, (1,), text, finished, reason, **kw)  # type: ignore[arg-type]


def test_chat_chunks() -> None:
    f = ChatFormatter("chatcmpl-1", 100, "m", "fp_x", names)
    (start,) = f.start_chunks(2)
    assert event(start) == {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 100, "model": "m",
        "system_fingerprint": "fp_x",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            {"index": 1, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
        ],
    }  # fmt: skip
    (content,) = f.output_chunks(1, out("hi"))
    assert event(content)["choices"] == [
        {"index": 1, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}
    ]
    content, finish = f.output_chunks(0, out("!", True, FinishReason.LENGTH))
    assert event(finish)["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert f.output_chunks(0, out("")) == []
    assert "usage" not in event(content)


def test_usage_null_on_chunks_and_usage_chunk_last() -> None:
    f = ChatFormatter("chatcmpl-1", 100, "m", "fp", names, include_usage=True)
    (chunk,) = f.output_chunks(0, out("x"))
    assert event(chunk)["usage"] is None
    usage = event(f.usage_chunk(Usage(3, 4, 2)))
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2},
    }  # fmt: skip


def test_chat_logprobs_and_full_response() -> None:
    f = ChatFormatter("chatcmpl-1", 100, "m", "fp", names, logprobs=True)
    lp = (TokenLogprob(1, -0.5, ((1, -0.5), (2, float("-inf")))),)
    (chunk,) = f.output_chunks(0, out("a", new_logprobs=lp))
    entry = event(chunk)["choices"][0]["logprobs"]["content"][0]  # type: ignore[index]
    assert entry == {
        "token": "a", "logprob": -0.5, "bytes": [97],
        "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -9999.0, "bytes": [98]}],
    }  # fmt: skip
    body = f.response([ChoiceState(["a", "b"], list(lp), "stop")], Usage(1, 2))
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ab", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == 3
    json.dumps(body, allow_nan=False)


def test_completion_chunks_and_logprobs() -> None:
    f = CompletionFormatter("cmpl-1", 100, "m", "fp", names, logprobs=True)
    first = f.output_chunks(0, out("a", new_logprobs=(TokenLogprob(1, -0.1, ((1, -0.1), (3, -2.0))),)))
    second = f.output_chunks(0, out("b", True, FinishReason.STOP, new_logprobs=(TokenLogprob(2, -0.2),)))
    c1, c2 = event(first[0]), event(second[0])
    assert c1["object"] == "text_completion"
    assert c1["choices"][0]["logprobs"] == {  # type: ignore[index]
        "tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1, "c": -2.0}], "text_offset": [0],
    }  # fmt: skip
    assert c2["choices"][0]["logprobs"]["text_offset"] == [1]  # type: ignore[index]
    assert c2["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    body = f.response([ChoiceState(["x"], [], "length")], Usage(1, 1))
    assert body["choices"] == [
        {"text": "x", "index": 0, "logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []},
         "finish_reason": "length"}
    ]  # fmt: skip


def test_error_event_and_done() -> None:
    assert event(sse_error(ServiceUnavailableError("down")))["error"]["message"] == "down"  # type: ignore[index]
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_text_with_unicode_line_breaks_stays_one_sse_line() -> None:
    # A model can emit U+2028, U+2029 or NEL; httpx's aiter_lines (guidellm's reader) splits on
    # them as str.splitlines() does, so written raw they cut the event (JSONDecodeError seen live).
    text = "a\u2028b\u2029c\x85d\x0be\x1cf\r\ng"
    chunks = [
        *CompletionFormatter("cmpl-1", 1, "m", "fp", names).output_chunks(0, out(text)),
        *ChatFormatter("chatcmpl-1", 1, "m", "fp", names).output_chunks(0, out(text)),
    ]
    for chunk in chunks:
        lines = chunk.decode().splitlines()
        assert lines[0].startswith("data: ") and lines[1:] == [""]  # one data line, then the blank
        body = json.loads(lines[0][len("data: ") :])
        choice = body["choices"][0]
        assert choice.get("text", choice.get("delta", {}).get("content")) == text  # the text is intact
