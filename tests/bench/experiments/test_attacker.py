"""bench.experiments.attacker's report: the victim's success rate and TTFT p99 ratio, the attacker's 5xx."""

from __future__ import annotations

from collections import Counter

from bench.experiments.attacker import markdown, parse_args, summarize
from bench.hostile import StreamResult


def _ok(ttft_s: float) -> StreamResult:
    return StreamResult(200, True, ttft_s, ttft_s * 4, 0.0)


def test_targets_are_checked() -> None:
    alone = [_ok(0.1)] * 99 + [_ok(0.2)]
    attacked = [_ok(0.1)] * 99 + [_ok(0.22)]
    report = summarize(alone, attacked, {"seed_2_64": Counter({400: 3})}, {"idle": 1.0})
    assert report["alone"]["success_rate"] == 1.0
    assert report["ttft_p99_ratio"] is not None and 1.0 < report["ttft_p99_ratio"] <= 1.2
    assert report["targets"] == {
        "victim_success_100pct": True,
        "ttft_p99_within_1_2x": True,
        "ttft_p99_within_1_5x": True,
        "attacker_5xx": 0,
    }
    assert "| seed_2_64 | 400: 3 |" in markdown(report, "python -m bench.experiments.attacker")


def test_issue_24s_looser_target_is_checked_beside_issue_10s() -> None:
    alone = [_ok(0.1)] * 90 + [_ok(0.2)] * 10
    report = summarize(alone, [_ok(0.1)] * 90 + [_ok(0.28)] * 10, {}, {"idle": 1.0})
    assert report["ttft_p99_ratio"] == 1.4
    assert (
        report["targets"]["ttft_p99_within_1_2x"] is False
        and report["targets"]["ttft_p99_within_1_5x"] is True
    )
    assert "(issue 10's target <= 1.2: NOT met; issue 24's <= 1.5: met)" in markdown(report, "cmd")
    worse = summarize(alone, [_ok(0.1)] * 90 + [_ok(0.32)] * 10, {}, {"idle": 1.0})
    assert worse["targets"]["ttft_p99_within_1_5x"] is False


def test_the_streams_itl_is_compared_across_phases() -> None:
    def stream(gap_s: float) -> StreamResult:
        return StreamResult(200, True, 0.1, 1.0, 0.0, itl_s=(gap_s,) * 8)

    report = summarize([stream(0.1)] * 4, [stream(0.15)] * 4, {}, {"idle": 1.0})
    assert report["alone"]["itl_ms"]["p50"] == 100.0 and report["attacked"]["itl_ms"]["p50"] == 150.0
    assert report["itl_p50_ratio"] == 1.5 and report["itl_p99_ratio"] == 1.5
    assert "ITL attacked / alone: p50 **1.5**, p99 **1.5**" in markdown(report, "cmd")


def test_a_failed_victim_request_or_an_attacker_5xx_misses_the_target() -> None:
    alone = [_ok(0.1)] * 10
    attacked = [_ok(0.1)] * 9 + [StreamResult(200, False, 0.1, 0.5, 0.0)]  # an error event mid-stream
    report = summarize(alone, attacked, {"never_fits": Counter({500: 1, 400: 2})}, {"idle": 1.0})
    assert report["attacked"]["success_rate"] == 0.9
    assert report["attacked"]["statuses"] == {"200": 9, "200_incomplete": 1}
    assert report["targets"]["victim_success_100pct"] is False
    assert report["targets"]["attacker_5xx"] == 1


def test_a_flood_reports_the_victims_ttft_p50_against_alone() -> None:
    alone = [_ok(0.1)] * 10
    attacked = [_ok(0.14)] * 10
    report = summarize(
        alone, attacked, {"random_key_ids": Counter({401: 500})}, {"idle": 1.0}, "random_key_ids"
    )
    assert report["ttft_p50_ratio"] == 1.4 and report["targets"]["ttft_p50_within_1_5x"] is True
    assert "Flood `random_key_ids`: TTFT p50 attacked / alone: **1.4**" in markdown(report, "cmd")
    slowed = summarize(alone, [_ok(0.2)] * 10, {}, {"idle": 1.0}, "unknown_paths_victim_id")
    assert slowed["targets"]["ttft_p50_within_1_5x"] is False


def test_serve_args_pass_through_in_order() -> None:
    args = parse_args(
        ["--serve-arg=--gil-switch-interval-ms", "--serve-arg=5", "--serve-arg=--cpu-reserved-cores=0"]
    )
    assert args.serve_arg == ["--gil-switch-interval-ms", "5", "--cpu-reserved-cores=0"]
    assert parse_args([]).serve_arg == []
