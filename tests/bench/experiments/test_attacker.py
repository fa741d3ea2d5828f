"""weir_bench.experiments.attacker's report: the victim's success rate and TTFT p99 ratio, the attacker's 5xx;
which probes a flood loops (issue 21's, issue 54's costly requests) and the largest chunk gap."""

from __future__ import annotations

from collections import Counter

import pytest

from weir_bench.costly_floods import COSTLY_PROBES
from weir_bench.experiments.attacker import attack_probe_names, markdown, parse_args, summarize
from weir_bench.hostile import StreamResult


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
    assert "| seed_2_64 | 400: 3 |" in markdown(report, "python -m weir_bench.experiments.attacker")


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


def test_a_flood_names_the_probes_the_attacker_loops(capsys: pytest.CaptureFixture[str]) -> None:
    assert attack_probe_names(parse_args(["--flood", "regex"])) == (
        "regex_nested_256",
        "regex_admitted_ambiguous",
    )
    assert attack_probe_names(parse_args(["--flood", "logit-bias"])) == ("logit_bias_300",)
    assert attack_probe_names(parse_args(["--flood", "stop"])) == ("stop_16x512",)
    assert attack_probe_names(parse_args(["--flood", "logprobs"])) == ("top_logprobs_20",)
    assert attack_probe_names(parse_args(["--flood", "plain"])) == ("plain_chat",)
    assert attack_probe_names(parse_args(["--flood", "random_key_ids"])) == ("random_key_ids",)
    assert attack_probe_names(parse_args(["--probes", "seed_2_64,deep_json"])) == ("seed_2_64", "deep_json")
    costly = {p.name for p in COSTLY_PROBES}
    for flood in ("regex", "logit-bias", "stop", "logprobs", "plain"):
        assert set(attack_probe_names(parse_args(["--flood", flood]))) <= costly
    with pytest.raises(SystemExit):
        parse_args(["--flood", "json-bomb"])
    assert "--flood" in capsys.readouterr().err


def test_a_flood_reports_the_victims_largest_chunk_gap_and_ttft_p99_against_alone() -> None:
    def stream(ttft_s: float, *gaps: float) -> StreamResult:
        return StreamResult(200, True, ttft_s, 1.0, 0.0, itl_s=gaps)

    alone = [stream(0.1, 0.05, 0.05, 0.2)] * 4
    attacked = [stream(0.1, 0.05, 0.05)] * 3 + [stream(0.3, 0.05, 0.6)]
    report = summarize(
        alone, attacked, {"regex_admitted_ambiguous": Counter({200: 7})}, {"idle": 1.0}, "regex"
    )
    assert report["alone"]["largest_gap_ms"] == 200.0 and report["attacked"]["largest_gap_ms"] == 600.0
    assert report["largest_gap_ratio"] == 3.0 and report["ttft_p99_ratio"] is not None
    text = markdown(report, "cmd")
    assert "| 200.0 |" in text and "| 600.0 |" in text
    assert f"TTFT p99 **{report['ttft_p99_ratio']}**; largest chunk gap **3.0**" in text
    no_streams = summarize([], [], {}, {"idle": 1.0}, "stop")
    assert no_streams["largest_gap_ratio"] is None and no_streams["alone"]["largest_gap_ms"] is None
