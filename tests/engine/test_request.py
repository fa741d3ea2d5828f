"""Request state and SamplingParams: progress, appending tokens, finish statuses, validation."""

from __future__ import annotations

import pytest

from weir.engine.errors import InvalidRequestError
from weir.engine.request import (
    FinishReason,
    Priority,
    Request,
    RequestStatus,
    RequestTimes,
    SamplingParams,
    TokenDelta,
)
from weir.engine.text.output_processor import OutputProcessor


def _request(max_tokens: int = 3, stop_token_ids: tuple[int, ...] = ()) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=stop_token_ids)
    req = Request("r", [10, 11, 12], params, arrival_s=100.0)
    req.checker = OutputProcessor(None, req.prompt_token_ids, params, eos_token_ids=(0,))
    return req


def test_progress_is_computed_tokens_catching_up_with_known_tokens() -> None:
    req = _request()
    assert (req.num_tokens, req.num_remaining) == (3, 3)
    req.num_computed_tokens = 2  # a prefill chunk of 2
    assert req.num_remaining == 1
    req.num_computed_tokens = 3
    req.append_token(20, now=101.0)
    assert (req.num_tokens, req.num_output_tokens, req.num_remaining) == (4, 1, 1)
    assert [req.token_at(p) for p in range(4)] == [10, 11, 12, 20] == req.all_token_ids


def test_append_token_stamps_times_and_reports_the_end() -> None:
    req = _request(max_tokens=3, stop_token_ids=(99,))
    assert req.append_token(20, now=101.0) == TokenDelta("")
    assert req.append_token(21, now=101.5).finish_reason is None
    last = req.append_token(99, now=102.5)
    assert last.finished and last.finish_reason is FinishReason.STOP and last.stop_reason == 99
    assert req.output_token_ids == [20, 21, 99]
    assert req.times.first_token_s == 101.0 and req.times.token_s == [101.0, 101.5, 102.5]
    assert req.times.ttft_s == 1.0 and req.times.tpot_s == 0.75 and req.times.itl_s == [0.5, 1.0]


def test_append_token_ends_at_max_tokens_and_at_eos() -> None:
    req = _request(max_tokens=2)
    req.append_token(5, now=1.0)
    assert req.append_token(6, now=2.0).finish_reason is FinishReason.LENGTH
    eos = _request(max_tokens=5)
    delta = eos.append_token(0, now=1.0)
    assert delta.finish_reason is FinishReason.STOP and delta.stop_reason is None


def test_a_failing_check_appends_nothing() -> None:
    class Broken:
        def step(self, token_id: int) -> TokenDelta:
            raise ValueError("detokenizer broke")

    req = _request()
    req.checker = Broken()
    with pytest.raises(ValueError):
        req.append_token(5, now=1.0)
    assert req.output_token_ids == [] and req.times.first_token_s is None
    req.checker = None  # a beam: its group appends its tokens, never append_token
    with pytest.raises(RuntimeError):
        req.append_token(5, now=1.0)


def test_finish_reasons_map_to_finished_statuses() -> None:
    assert {r: r.status for r in FinishReason} == {
        FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
        FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
        FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
        FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
    }
    assert all(r.status.is_finished for r in FinishReason)
    assert not any(
        s.is_finished for s in (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)
    )


def test_choices_and_beams_report_their_callers_id() -> None:
    params = SamplingParams()
    assert Request("a", [1], params).caller_id == "a"
    assert Request("a#1", [1], params, parent_id="a", index=1).caller_id == "a"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"stop": ("",)}, "stop"),
        ({"stop": tuple(str(i) for i in range(17))}, "stop"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": 17}, "n"),
        ({"use_beam_search": True, "beam_width": 17}, "beam_width"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_sampling_params_name_the_field_they_refuse(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.param == param


def test_requests_refuse_an_empty_prompt_and_a_bad_weight() -> None:
    with pytest.raises(InvalidRequestError) as info:
        Request("r", [], SamplingParams())
    assert info.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as info:
        Request("r", [1], SamplingParams(), weight=0.0)
    assert info.value.param == "weight"
    assert Priority.parse("Batch") is Priority.BATCH
    with pytest.raises(InvalidRequestError):
        Priority.parse("urgent")


def test_times_without_tokens_have_no_latencies() -> None:
    times = RequestTimes(arrival_s=5.0)
    assert (times.ttft_s, times.queue_s, times.e2e_s, times.tpot_s, times.itl_s) == (
        None,
        None,
        None,
        None,
        [],
    )
    times.first_scheduled_s, times.finished_s = 5.5, 9.0
    assert (times.queue_s, times.e2e_s) == (0.5, 4.0)


def test_all_token_ids_is_kept_incrementally() -> None:
    req = _request(max_tokens=5)
    ids = req.all_token_ids
    assert ids == [10, 11, 12]
    req.append_token(20, now=1.0)
    req.append_token(21, now=2.0)
    again = req.all_token_ids
    assert again is ids  # the same list, extended by the new tokens: no copy per call
    assert again == [10, 11, 12, 20, 21]
    assert req.all_token_ids is ids


def test_all_token_ids_follows_a_replaced_or_cut_output() -> None:
    req = _request(max_tokens=5)
    req.append_token(20, now=1.0)
    assert req.all_token_ids == [10, 11, 12, 20]
    req.output_token_ids = [7, 8]  # a beam takes its parent's tokens
    assert req.all_token_ids == [10, 11, 12, 7, 8]
    req.output_token_ids.append(9)
    assert req.all_token_ids == [10, 11, 12, 7, 8, 9]
    assert [req.token_at(p) for p in range(6)] == req.all_token_ids
