"""Tests of engine/text/stop_checker.py: stop strings across pieces, stop tokens, max_tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.engine.request import FinishReason, SamplingParams, TokenDelta
from weir.engine.text.stop_checker import StopChecker

EOS = 2
WORD = 7  # any ordinary token id


def run(checker: StopChecker, pieces: list[str], token_ids: list[int] | None = None) -> list[TokenDelta]:
    """Feed pieces until the checker finishes; return the decisions made."""
    ids = token_ids or [WORD] * len(pieces)
    decisions = []
    for token_id, piece in zip(ids, pieces, strict=True):
        decisions.append(checker.step(token_id, piece))
        if decisions[-1].finished:
            break
    return decisions


def streamed(decisions: list[TokenDelta]) -> str:
    return "".join(d.text for d in decisions)


def test_stop_string_spanning_pieces_is_cut_and_held_back() -> None:
    checker = StopChecker(SamplingParams(max_tokens=100, stop=("STOP",)), (EOS,))
    decisions = run(checker, ["Hel", "lo S", "TO", "P and more", "never seen"])
    assert [d.text for d in decisions] == ["Hel", "lo ", "", ""]
    assert decisions[-1].finish_reason is FinishReason.STOP
    assert decisions[-1].stop_reason == "STOP"
    assert checker.finished and checker.num_output_tokens == 4


def test_include_stop_str_in_output() -> None:
    params = SamplingParams(max_tokens=100, stop=("STOP",), include_stop_str_in_output=True)
    decisions = run(StopChecker(params, (EOS,)), ["Hel", "lo S", "TO", "P and more"])
    assert streamed(decisions) == "Hello STOP"
    assert decisions[-1].stop_reason == "STOP"


def test_false_prefix_is_released() -> None:
    checker = StopChecker(SamplingParams(max_tokens=100, stop=("STOP",)), (EOS,))
    decisions = run(checker, ["ST", "AR", "S", "T"])
    assert [d.text for d in decisions] == ["", "STAR", "", ""]
    assert not checker.finished


def test_first_completed_stop_string_wins_then_longest() -> None:
    params = SamplingParams(max_tokens=100, stop=("world", "o w", "lo"))
    decisions = run(StopChecker(params, (EOS,)), ["hello world"])
    assert decisions[-1].stop_reason == "lo" and streamed(decisions) == "hel"
    # "bc" is complete before "abcd" is, whether the text comes at once or piece by piece.
    params = SamplingParams(max_tokens=100, stop=("abcd", "bc"), include_stop_str_in_output=True)
    for pieces in (["xabcd"], ["xa", "b", "cd"]):
        decisions = run(StopChecker(params, (EOS,)), pieces)
        assert decisions[-1].stop_reason == "bc" and streamed(decisions) == "xabc"
    # Same end: the longer one.
    params = SamplingParams(max_tokens=100, stop=("c", "abc"), include_stop_str_in_output=True)
    decisions = run(StopChecker(params, (EOS,)), ["xab", "cd"])
    assert decisions[-1].stop_reason == "abc" and streamed(decisions) == "xabc"


def test_eos_stops_with_no_stop_reason() -> None:
    checker = StopChecker(SamplingParams(max_tokens=100), (EOS, 99))
    decisions = run(checker, ["a", "b", ""], [WORD, WORD, 99])
    assert decisions[-1].finish_reason is FinishReason.STOP
    assert decisions[-1].stop_reason is None
    assert streamed(decisions) == "ab"


def test_ignore_eos_continues_until_length() -> None:
    checker = StopChecker(SamplingParams(max_tokens=3, ignore_eos=True), (EOS,))
    decisions = run(checker, ["a", "", "c"], [WORD, EOS, WORD])
    assert [d.finish_reason for d in decisions] == [None, None, FinishReason.LENGTH]
    assert decisions[-1].stop_reason is None
    assert not checker.is_stop_token(EOS)


def test_stop_token_ids_report_the_token() -> None:
    params = SamplingParams(max_tokens=100, stop_token_ids=(42,), ignore_eos=True)
    checker = StopChecker(params, (EOS,))
    assert checker.is_stop_token(42)
    decisions = run(checker, ["a", "", "b"], [WORD, 42, WORD])
    assert len(decisions) == 2
    assert decisions[-1].finish_reason is FinishReason.STOP and decisions[-1].stop_reason == 42


def test_max_tokens_releases_the_held_tail() -> None:
    checker = StopChecker(SamplingParams(max_tokens=2, stop=("STOP",)), (EOS,))
    assert checker.is_last_token(WORD) is False
    first = checker.step(WORD, "x ST")
    assert first.text == "x " and not first.finished
    assert checker.is_last_token(WORD) is True
    last = checker.step(WORD, "O")
    assert last.text == "STO" and last.finish_reason is FinishReason.LENGTH


def test_stop_string_found_on_the_eos_token_wins() -> None:
    checker = StopChecker(SamplingParams(max_tokens=100, stop=("END",)), (EOS,))
    checker.step(WORD, "the EN")
    decision = checker.step(EOS, "D!")
    assert decision.stop_reason == "END" and decision.text == ""


def test_step_after_finish_raises() -> None:
    checker = StopChecker(SamplingParams(max_tokens=1), (EOS,))
    assert checker.step(WORD, "a").finish_reason is FinishReason.LENGTH
    with pytest.raises(RuntimeError):
        checker.step(WORD, "b")


def reference(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    """The expected final text of a generation that produced `text`, and the stop string hit.

    Scans the text one character at a time, as if every character were its own token.
    """
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc é😀", max_size=4), min_size=1, max_size=20),
    stops=st.lists(st.text(alphabet="abc é😀", min_size=1, max_size=4), max_size=3, unique=True),
    include=st.booleans(),
)
def test_streamed_text_equals_the_reference_cut(pieces: list[str], stops: list[str], include: bool) -> None:
    params = SamplingParams(max_tokens=len(pieces), stop=tuple(stops), include_stop_str_in_output=include)
    decisions = run(StopChecker(params, (EOS,)), pieces)
    expected_text, expected_stop = reference("".join(pieces), tuple(stops), include)
    assert streamed(decisions) == expected_text
    assert decisions[-1].finished
    if expected_stop is None:
        assert decisions[-1].finish_reason is FinishReason.LENGTH
    else:
        assert decisions[-1].finish_reason is FinishReason.STOP
        assert decisions[-1].stop_reason == expected_stop
    # Text is never streamed ahead of what the final answer keeps.
    emitted = ""
    for decision in decisions:
        emitted += decision.text
        assert expected_text.startswith(emitted)
