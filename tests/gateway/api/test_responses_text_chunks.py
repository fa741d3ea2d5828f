"""The per-token SSE chunk (text only) is spliced from bytes built once per choice: it must be
byte for byte what serializing the whole choice dict gives (`ResponseFormatter._chunk`, the
general path every other chunk still takes)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason
from weir.gateway.api.responses import (
    ChatFormatter,
    CompletionFormatter,
    ResponseFormatter,
    _dumps,
    _dumps_str,
)

# Characters JSON escapes, the three line breaks it leaves raw (and `_dumps` escapes), quotes,
# backslashes and multi-byte text.
_TRICKY = ["", " hi", '"', "\\", "\n", "\r\n", "\t", "\x00", "\x1f", "\x7f", "\x85", "\u2028", "\u2029"]
_TRICKY += ["é", "日本語", "🙂", "a\u2028b\x85c", "</script>", "\ufffd"]


def _names(token_id: int) -> str:
    return str(token_id)


def _formatters(include_usage: bool) -> list[ResponseFormatter]:
    # An id, model and fingerprint with characters JSON escapes: the head is serialized once too.
    args = ('id-\u2028"1', 1_700_000_000, "model/é", "fp_\\x", _names)
    return [
        ChatFormatter(*args, include_usage=include_usage),
        CompletionFormatter(*args, include_usage=include_usage),
    ]


def _expected(formatter: ResponseFormatter, choice: int, text: str) -> bytes:
    entry: dict[str, Any]
    if isinstance(formatter, ChatFormatter):
        entry = {"index": choice, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
    else:
        entry = {"text": text, "index": choice, "logprobs": None, "finish_reason": None}
    return formatter._chunk([entry])


def _out(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", 0, (1,), text, finished, FinishReason.LENGTH if finished else None)


@settings(max_examples=300, deadline=None)
@given(text=st.text(), choice=st.integers(min_value=0, max_value=12), include_usage=st.booleans())
@example(text="\u2028", choice=0, include_usage=False)
@example(text='a"b\\c\n', choice=3, include_usage=True)
def test_text_chunk_is_byte_identical_to_the_general_path(
    text: str, choice: int, include_usage: bool
) -> None:
    for formatter in _formatters(include_usage):
        assert formatter._text_chunk(choice, text) == _expected(formatter, choice, text)
        assert formatter._text_chunk(choice, text) == _expected(formatter, choice, text)  # cached parts


def test_dumps_str_matches_dumps() -> None:
    for text in _TRICKY:
        assert _dumps_str(text) == _dumps(text).encode()
        assert b"\xe2\x80\xa8" not in _dumps_str(text)  # U+2028 never raw: it breaks SSE lines


def test_output_chunks_of_a_stream_equal_the_general_path() -> None:
    """A whole stream through `output_chunks`: text chunks spliced, the last one general."""
    for include_usage in (False, True):
        for formatter in _formatters(include_usage):
            for choice in (0, 2):
                for text in _TRICKY:
                    chunks = formatter.output_chunks(choice, _out(text))
                    assert chunks == ([_expected(formatter, choice, text)] if text else [])
                    for chunk in chunks:
                        event = json.loads(chunk[len(b"data: ") : -2])
                        assert event["choices"][0]["index"] == choice
                last = formatter.output_chunks(choice, _out("end", finished=True))
                if isinstance(formatter, ChatFormatter):
                    assert last[0] == _expected(formatter, choice, "end")
                    finish = {"index": choice, "delta": {}, "logprobs": None, "finish_reason": "length"}
                    assert last[1:] == [formatter._chunk([finish])]
                else:
                    entry = {"text": "end", "index": choice, "logprobs": None, "finish_reason": "length"}
                    assert last == [formatter._chunk([entry])]
