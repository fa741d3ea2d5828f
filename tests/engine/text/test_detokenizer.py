"""Tests of engine/text/detokenizer.py: streamed text equals the full decode and is byte-correct."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.multibyte_tokenizer import byte_level_tokenizer, metaspace_tokenizer
from weir.engine.text.detokenizer import IncrementalDetokenizer, make_decode_fn

MULTIBYTE_TEXTS = (
    "Hello 日本語 😀 world 👍🏽 café",
    "Привет, мир! 🚀🚀🚀",
    "中文字符测试，你好世界。€ 100 ❤️",
    "naïve façade 🎉 über",
)


def stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    pieces = [detok.push(chunk) for chunk in chunks]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_one_token_at_a_time_never_emits_a_partial_character(text: str) -> None:
    tokenizer = byte_level_tokenizer()
    prompt = tokenizer.encode("The quick brown fox")
    ids = tokenizer.encode(text)
    # The tokenizer really splits characters across tokens, or the test would prove nothing.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    pieces = [detok.push([i]) for i in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) + detok.flush() == text
    assert "".join(pieces) == text  # nothing was left for flush: the text ends on a whole character


@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip_special_tokens=st.booleans())
def test_streaming_equals_full_decode_for_random_tokens(
    data: st.DataObject, skip_special_tokens: bool
) -> None:
    tokenizer = byte_level_tokenizer()
    vocab = len(tokenizer)
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8), label="prompt")
    output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40), label="output")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(output)), max_size=10), label="cuts"))
    bounds = [0, *cuts, len(output)]
    chunks = [output[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip_special_tokens)
    pieces = stream(detok, chunks)
    expected = tokenizer.decode(output, skip_special_tokens=skip_special_tokens)
    assert "".join(pieces) == expected
    # Only flush may end on a replacement character: push holds incomplete characters back.
    assert all(not piece.endswith("\ufffd") for piece in pieces[:-1])


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_streaming_multibyte_text_in_random_chunks(data: st.DataObject) -> None:
    tokenizer = byte_level_tokenizer()
    text = data.draw(st.text(alphabet="ab 日本語😀👍🏽éПр€", max_size=30), label="text")
    ids = tokenizer.encode(text)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(ids)), max_size=10), label="cuts"))
    bounds = [0, *cuts, len(ids)]
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Hi"), skip_special_tokens=True)
    pieces = stream(detok, [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == text


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_sentencepiece_streaming_equals_decode_in_prompt_context(data: st.DataObject) -> None:
    tokenizer = metaspace_tokenizer()
    prompt = tokenizer.encode(
        data.draw(st.sampled_from(["The quick", "Hello, world!", "fox"]), label="prompt")
    )
    # Byte tokens come only from encoding real text: a byte-fallback decoder turns a whole run of
    # byte tokens into U+FFFD when any of them is invalid, so random byte runs can rewrite text
    # that was complete (documented in engine/text/detokenizer.py).
    word_ids = [
        i for i in range(3, len(tokenizer)) if not tokenizer.convert_ids_to_tokens(i).startswith("<0x")
    ]
    pieces_of_output = data.draw(
        st.lists(
            st.one_of(
                st.lists(st.sampled_from(word_ids), min_size=1, max_size=3),
                st.text(alphabet="ab é日本😀€", min_size=1, max_size=4).map(lambda t: tokenizer.encode(t)),
            ),
            max_size=8,
        ),
        label="output",
    )
    output = [i for piece in pieces_of_output for i in piece]
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    pieces = stream(detok, [[i] for i in output])
    expected = tokenizer.decode(prompt + output)[len(tokenizer.decode(prompt)) :]
    assert "".join(pieces) == expected
    assert all(not piece.endswith("\ufffd") for piece in pieces[:-1])


def test_special_tokens_skipped_or_kept() -> None:
    tokenizer = byte_level_tokenizer()
    ids = [*tokenizer.encode("Hi"), tokenizer.eos_token_id, *tokenizer.encode(" there")]
    skipped = IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=True)
    assert "".join(stream(skipped, [[i] for i in ids])) == "Hi there"
    kept = IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=False)
    assert "".join(stream(kept, [[i] for i in ids])) == "Hi<|im_end|> there"


def test_prompt_context_keeps_the_leading_space_of_sentencepiece_tokens() -> None:
    tokenizer = metaspace_tokenizer()
    prompt = tokenizer.encode("The quick")
    output = tokenizer.encode("The lazy dog café 日本 😀")[1:]  # drop "▁The": starts with "▁lazy"
    assert tokenizer.decode(output).startswith("lazy")  # decoded alone, the space is lost
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    pieces = stream(detok, [[i] for i in output])
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == " lazy dog café 日本 😀"


def test_prompt_ending_inside_a_character_does_not_lose_text() -> None:
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("ok 😀 fine")
    split = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tokenizer, ids[:split], skip_special_tokens=True)
    text = "".join(stream(detok, [[i] for i in ids[split:]]))
    assert text == tokenizer.decode(ids[split:])
    assert text.endswith(" fine")


def test_flush_releases_an_incomplete_character() -> None:
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("a😀")
    partial = ids[:-1]
    detok = IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=True)
    assert "".join(detok.push([i]) for i in partial) == "a"
    assert detok.flush() == tokenizer.decode(partial)[1:]
    assert detok.flush() == ""
    assert detok.push([]) == ""


class CountingTokenizer:
    """A slow-path tokenizer wrapper (no backend) that records how many ids each decode sees."""

    def __init__(self) -> None:
        self.inner = byte_level_tokenizer()
        self.window_sizes: list[int] = []

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        self.window_sizes.append(len(token_ids))
        return self.inner.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


def test_work_per_token_is_bounded_by_the_window() -> None:
    tokenizer = CountingTokenizer()
    ids = tokenizer.inner.encode("The quick brown fox 😀 jumps over the lazy dog. " * 40)
    detok = IncrementalDetokenizer(tokenizer, ids[:10], skip_special_tokens=True)
    text = "".join(stream(detok, [[i] for i in ids]))
    assert text == tokenizer.inner.decode(ids)
    assert len(ids) > 400
    assert max(tokenizer.window_sizes) <= 8  # an emoji spans at most a few tokens


def test_fast_and_python_decode_paths_agree() -> None:
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("Hi 😀 <|im_end|> café")
    for skip in (True, False):
        fast = make_decode_fn(tokenizer, skip)
        slow = make_decode_fn(CountingTokenizer(), skip)
        assert fast(ids) == slow(ids) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_real_tokenizer_streaming(request: pytest.FixtureRequest) -> None:
    """Runs once the lead's `real_model_dir` fixture exists (the prepared SmolLM2 folder)."""
    try:
        model_dir = request.getfixturevalue("real_model_dir")
    except pytest.FixtureLookupError:
        pytest.skip("no real_model_dir fixture")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.encode("Say hello in many languages:")
    for text in MULTIBYTE_TEXTS:
        ids = tokenizer.encode(text)
        detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
        pieces = stream(detok, [[i] for i in ids])
        assert all("\ufffd" not in piece for piece in pieces)
        assert "".join(pieces) == text
