"""Tests of engine/text/output_processor.py: detokenizer and stop checker combined, per request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.multibyte_tokenizer import byte_level_tokenizer
from weir.engine.request import FinishReason, SamplingParams, TokenDelta
from weir.engine.text.output_processor import OutputProcessor


def feed(processor: OutputProcessor, token_ids: list[int]) -> list[TokenDelta]:
    outputs = []
    for token_id in token_ids:
        outputs.append(processor.step(token_id))
        if outputs[-1].finished:
            break
    return outputs


def make(params: SamplingParams, prompt: str = "The quick brown fox") -> OutputProcessor:
    tokenizer = byte_level_tokenizer()
    return OutputProcessor(tokenizer, tokenizer.encode(prompt), params, (tokenizer.eos_token_id,))


def encode(text: str) -> list[int]:
    return byte_level_tokenizer().encode(text)


def test_streams_multibyte_text_without_replacement_characters() -> None:
    text = "Hello 日本語 😀 world 👍🏽 café"
    processor = make(SamplingParams(max_tokens=100))
    outputs = feed(processor, encode(text))
    assert all("\ufffd" not in o.text for o in outputs)
    assert "".join(o.text for o in outputs) == text == processor.output_text
    assert not processor.finished and processor.num_output_tokens == len(encode(text))


def test_eos_stops_and_its_text_is_left_out() -> None:
    eos = byte_level_tokenizer().eos_token_id
    processor = make(SamplingParams(max_tokens=100, skip_special_tokens=False))
    outputs = feed(processor, [*encode("Hi 😀"), eos, *encode("ignored")])
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].stop_reason is None
    assert processor.output_text == "Hi 😀"
    assert processor.finished and processor.finish_reason is FinishReason.STOP


def test_eos_text_included_when_asked_and_not_skipped() -> None:
    eos = byte_level_tokenizer().eos_token_id
    params = SamplingParams(max_tokens=100, skip_special_tokens=False, include_stop_str_in_output=True)
    processor = make(params)
    feed(processor, [*encode("Hi"), eos])
    assert processor.output_text == "Hi<|im_end|>"


def test_ignore_eos_keeps_going() -> None:
    eos = byte_level_tokenizer().eos_token_id
    processor = make(SamplingParams(max_tokens=4, ignore_eos=True))
    outputs = feed(processor, [*encode("ab"), eos, *encode("c"), *encode("never")])
    assert len(outputs) == 4
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert processor.output_text == "abc"


def test_stop_token_ids() -> None:
    stop_id = encode("c")[0]
    processor = make(SamplingParams(max_tokens=100, stop_token_ids=(stop_id,)))
    outputs = feed(processor, encode("ab") + [stop_id] + encode("de"))
    assert outputs[-1].stop_reason == stop_id and processor.output_text == "ab"


def test_stop_string_across_multibyte_tokens() -> None:
    params = SamplingParams(max_tokens=100, stop=("😀 w",))
    processor = make(params)
    ids = encode("Hello 日本語 😀 world")
    outputs = feed(processor, ids)
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].stop_reason == "😀 w"
    assert processor.output_text == "Hello 日本語 "
    assert len(outputs) < len(ids)  # stopped before "orld" was produced


def test_stop_string_included() -> None:
    params = SamplingParams(max_tokens=100, stop=("STOP",), include_stop_str_in_output=True)
    processor = make(params)
    feed(processor, encode("Stop here. STOP. The end."))
    assert processor.output_text == "Stop here. STOP"
    assert processor.stop_reason == "STOP"


def test_max_tokens_cutting_a_character_flushes_it() -> None:
    ids = encode("a😀")
    processor = make(SamplingParams(max_tokens=len(ids) - 1))
    outputs = feed(processor, ids)
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    # The incomplete emoji bytes come out as U+FFFD on the last step, like a full decode.
    assert processor.output_text == byte_level_tokenizer().decode(ids[:-1])
    assert processor.output_text.startswith("a")


def test_step_after_finish_raises() -> None:
    processor = make(SamplingParams(max_tokens=1))
    assert processor.step(encode("a")[0]).finished
    with pytest.raises(RuntimeError):
        processor.step(encode("b")[0])


def test_without_tokenizer_text_is_empty() -> None:
    processor = OutputProcessor(None, [1, 2], SamplingParams(max_tokens=2), (0,))
    assert processor.step(5) == TokenDelta("")
    assert processor.step(0).finish_reason is FinishReason.STOP  # EOS is a token decision
    with pytest.raises(ValueError, match="stop strings"):
        OutputProcessor(None, [1], SamplingParams(stop=("x",)), (0,))


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(alphabet="ab 日本😀é.", max_size=24),
    stops=st.lists(st.text(alphabet="ab 日本😀é.", min_size=1, max_size=3), max_size=2, unique=True),
    include=st.booleans(),
)
def test_streamed_text_equals_final_text_and_full_decode(text: str, stops: list[str], include: bool) -> None:
    ids = encode(text)
    if not ids:
        return
    params = SamplingParams(max_tokens=len(ids), stop=tuple(stops), include_stop_str_in_output=include)
    processor = make(params, prompt="Hi")
    outputs = feed(processor, ids)
    streamed = "".join(o.text for o in outputs)
    assert streamed == processor.output_text
    assert "\ufffd" not in streamed
    assert outputs[-1].finished
    if outputs[-1].finish_reason is FinishReason.LENGTH:
        assert streamed == text
    else:
        stop = outputs[-1].stop_reason
        assert isinstance(stop, str) and stop in stops
        assert text.startswith(streamed)
        assert streamed.endswith(stop) if include else text[len(streamed) :].startswith(stop)
