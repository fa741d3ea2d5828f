"""weir_bench.experiments.opening_burst: a burst's figures and the command line."""

from __future__ import annotations

import pytest

from weir_bench.experiments.opening_burst import BurstRequest, parse_args, summarize


def test_a_request_meets_its_targets_with_its_first_token_and_every_gap_in_time() -> None:
    assert BurstRequest(1.9, (0.1, 0.104)).met(2.0, 0.1, 0.05)
    assert not BurstRequest(2.1, (0.05,)).met(2.0, 0.1, 0.05)  # first token late
    assert not BurstRequest(0.5, (0.05, 0.2)).met(2.0, 0.1, 0.05)  # one gap too long


def test_a_round_counts_first_tokens_in_time_and_requests_meeting_both() -> None:
    got = [BurstRequest(0.3, (0.09,)), BurstRequest(1.8, (0.3,)), BurstRequest(2.6, (0.05,))]
    assert summarize(got, 2.0, 0.1, 0.05) == {
        "first_tokens_s": [0.3, 1.8, 2.6],
        "within_ttft": 2,
        "met_both": 1,
        "max_gap_s": 0.3,
        "num_requests": 3,
    }


def test_counts_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--prompts", "4"]).prompts == 4
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
