"""Prompt size bounds: refused from lengths and counts alone, before any template or tokenizer runs."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MAX_MODEL_LEN, MODEL, make_app, serve_in_thread, tokenizer
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.protocol import ChatMessage, Role
from weir.gateway.http.errors import BadRequestError
from weir.gateway.prompts.prompt_limits import (
    FALLBACK_CHARS_PER_TOKEN,
    INLINE_MAX_ITEMS,
    PromptLimits,
    chat_bytes,
    check_chat_size,
    check_prompt_sizes,
    prompts_bytes,
)
from weir.gateway.prompts.tokenization import PromptBuilder, longest_token_chars
from weir.gateway.settings.settings import Settings

LONGEST = 13  # "<|endoftext|>", the tiny tokenizer's longest token


class _CountingTokenizer:
    """The tiny tokenizer, counting every template render and encode (its copies count too)."""

    def __init__(self, inner: Any, calls: list[str] | None = None) -> None:
        self.inner = inner
        self.calls = calls if calls is not None else []

    def __deepcopy__(self, memo: dict[int, Any]) -> _CountingTokenizer:
        return _CountingTokenizer(copy.deepcopy(self.inner, memo), self.calls)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.inner.get_vocab())

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.calls.append("template")
        return self.inner.apply_chat_template(conversation, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls.append("encode")
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return str(self.inner.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def __len__(self) -> int:
        return len(self.inner)


def test_the_bound_defaults_to_the_longest_token() -> None:
    assert longest_token_chars(tokenizer()) == LONGEST
    assert PromptLimits().resolved_chars_per_token(LONGEST) == LONGEST
    assert PromptLimits(chars_per_token=4).resolved_chars_per_token(LONGEST) == 4
    assert PromptLimits().resolved_chars_per_token(None) == FALLBACK_CHARS_PER_TOKEN
    with pytest.raises(ValueError, match="max_chat_messages"):
        PromptLimits(max_chat_messages=0)


def test_text_that_cannot_fit_is_refused_from_its_length() -> None:
    fits = "x" * (4 * 9)  # at least 9 tokens of 4 characters: room for 1 output token in 10
    check_prompt_sizes([fits], 10, 4)
    check_chat_size([ChatMessage(Role.USER, fits)], 10, 4)
    with pytest.raises(BadRequestError) as info:
        check_prompt_sizes([fits + "x"], 10, 4)
    assert info.value.param == "prompt" and info.value.code == "prompt_too_long"
    with pytest.raises(BadRequestError) as info:
        check_prompt_sizes(["a", fits + "x"], 10, 4)
    assert info.value.param == "prompt[1]"
    with pytest.raises(BadRequestError) as info:
        check_chat_size([ChatMessage(Role.USER, fits), ChatMessage(Role.USER, "x")], 10, 4)
    assert info.value.param == "messages"


def test_the_whole_request_is_bounded_from_lengths() -> None:
    one = "x" * 4 * 60_000  # 60,000 tokens at least, each fits a 100,000-token context
    check_prompt_sizes([one], 100_000, 4)
    with pytest.raises(BadRequestError) as info:
        check_prompt_sizes([one, (1,) * 40_001], 100_000, 4)  # beyond the 100,000 a request holds
    assert info.value.param == "prompt"


@pytest.fixture(scope="module")
def counted() -> Iterator[tuple[list[str], httpx.Client]]:
    counting = _CountingTokenizer(tokenizer())
    settings = Settings(max_chat_messages=64)
    app = make_app(FakeEngine(), settings)
    # The served version's builder tokenizes through the counting tokenizer.
    app.state.fleet.versions()[0].prompts = PromptBuilder(counting)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield counting.calls, client


def test_a_prompt_too_long_for_the_context_is_never_tokenized(
    counted: tuple[list[str], httpx.Client],
) -> None:
    calls, client = counted
    calls.clear()
    text = "hello " * (LONGEST * MAX_MODEL_LEN // 6 + 1)  # 256 tokens at least, by its length
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long", r.text
    r = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": text}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert calls == []
    # Just under the bound it is tokenized, and the exact count decides (512 words: too long).
    text = "hello " * (LONGEST * (MAX_MODEL_LEN - 1) // 6)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert calls == ["encode"]


def test_too_many_messages_are_refused_before_the_template(counted: tuple[list[str], httpx.Client]) -> None:
    calls, client = counted
    calls.clear()
    messages = [{"role": "user", "content": ""}] * 65
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    parts = [{"type": "text", "text": "a"}] * 65
    r = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": parts}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content", r.text
    assert calls == []
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages[:64], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_millions_of_token_ids_are_refused_from_their_count(counted: tuple[list[str], httpx.Client]) -> None:
    _, client = counted
    for prompt in ([5] * 70_000, [[5] * 35_000, [5] * 35_000], [True] * 70_000):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": "the prompts hold 70000 token ids together; one request may hold at most 65536",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "prompt_too_long",
        }


# -- the sizes that decide where a prompt is tokenized ---------------------------------------------


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


_texts = st.text(max_size=40)


@given(
    st.lists(
        st.tuples(_texts, st.none() | st.text(max_size=8), st.none() | _texts), max_size=INLINE_MAX_ITEMS
    ),
    st.integers(0, 200),
)
def test_chat_bytes_are_exact_up_to_the_limit(
    parts: list[tuple[str, str | None, str | None]], limit: int
) -> None:
    messages = [
        ChatMessage(Role.USER, content, name=name, tool_call_id=call_id) for content, name, call_id in parts
    ]
    exact = sum(_utf8(c) + _utf8(n or "") + _utf8(i or "") for c, n, i in parts)
    got = chat_bytes(messages, limit)
    if exact <= limit:
        assert got == exact
    else:
        assert got > limit


@given(
    st.lists(_texts | st.lists(st.integers(0, 99), max_size=40).map(tuple), max_size=INLINE_MAX_ITEMS),
    st.integers(0, 200),
)
def test_prompts_bytes_are_exact_up_to_the_limit(prompts: list[str | tuple[int, ...]], limit: int) -> None:
    exact = sum(_utf8(p) if isinstance(p, str) else len(p) for p in prompts)
    got = prompts_bytes(prompts, limit)
    if exact <= limit:
        assert got == exact
    else:
        assert got > limit


def test_non_ascii_text_counts_its_utf8_bytes() -> None:
    assert chat_bytes([ChatMessage(Role.USER, "héllo 世界")], 100) == len("héllo 世界".encode())
    assert prompts_bytes(["世界"], 100) == 6


def test_a_huge_text_is_sized_without_encoding_it() -> None:
    # Past the limit in characters, hence in bytes: no encode of a megabyte to find that out.
    assert chat_bytes([ChatMessage(Role.USER, "é" * 1_000_000)], 512) > 512
    assert prompts_bytes(["é" * 1_000_000], 512) > 512


def test_many_items_or_earlier_tool_calls_count_as_above_any_limit() -> None:
    many = [ChatMessage(Role.USER, "")] * (INLINE_MAX_ITEMS + 1)
    assert chat_bytes(many, 10_000) > 10_000
    assert prompts_bytes([""] * (INLINE_MAX_ITEMS + 1), 10_000) > 10_000
    call = sb.ToolCall(id="c1", function=sb.FunctionCall(name="f", arguments="{}"))
    assert chat_bytes([ChatMessage(Role.ASSISTANT, "", tool_calls=(call,))], 10_000) > 10_000
