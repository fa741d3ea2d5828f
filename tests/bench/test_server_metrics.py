"""weir_bench.server_metrics: parsing /metrics and checking a report against it."""

from __future__ import annotations

import pytest

from weir_bench.server_metrics import MetricNames, check_agreement, parse_server_metrics

BEFORE = """
# TYPE weir_prompt_tokens counter
weir_prompt_tokens_total{tenant="acme"} 100
# TYPE weir_generation_tokens counter
weir_generation_tokens_total{tenant="acme"} 40
# TYPE weir_time_to_first_token_seconds histogram
weir_time_to_first_token_seconds_bucket{tenant="acme",le="+Inf"} 4
weir_time_to_first_token_seconds_sum{tenant="acme"} 0.4
weir_time_to_first_token_seconds_count{tenant="acme"} 4
"""
AFTER = """
# TYPE weir_prompt_tokens counter
weir_prompt_tokens_total{tenant="acme"} 160
weir_prompt_tokens_total{tenant="globex"} 40
# TYPE weir_generation_tokens counter
weir_generation_tokens_total{tenant="acme"} 70
weir_generation_tokens_total{tenant="globex"} 20
# TYPE weir_time_to_first_token_seconds histogram
weir_time_to_first_token_seconds_bucket{tenant="acme",le="+Inf"} 7
weir_time_to_first_token_seconds_sum{tenant="acme"} 0.7
weir_time_to_first_token_seconds_count{tenant="acme"} 7
weir_time_to_first_token_seconds_bucket{tenant="globex",le="+Inf"} 2
weir_time_to_first_token_seconds_sum{tenant="globex"} 0.24
weir_time_to_first_token_seconds_count{tenant="globex"} 2
"""


def group(prompt: int, output: int, ttft_mean: float | None) -> dict:
    return {"prompt_tokens": prompt, "output_tokens": output, "ttft_ms": {"mean": ttft_mean}}


def test_parse_and_delta() -> None:
    delta = parse_server_metrics(AFTER).minus(parse_server_metrics(BEFORE))
    assert delta.total("weir_prompt_tokens_total") == 100.0
    assert delta.total("weir_prompt_tokens_total", tenant="acme") == 60.0
    assert delta.total("weir_generation_tokens_total", tenant="globex") == 20.0
    assert delta.total("nope") is None


def test_agreement_overall_and_per_tenant() -> None:
    delta = parse_server_metrics(AFTER).minus(parse_server_metrics(BEFORE))
    # server: 5 first tokens, 0.54 s in all -> 108 ms mean
    assert check_agreement(group(100, 50, 112.0), delta).ok
    acme = check_agreement(group(60, 30, 101.0), delta, labels={"tenant": "acme"})
    assert acme.ok and acme.server_ttft_mean_ms == pytest.approx(100.0)
    bad = check_agreement(group(99, 50, 400.0), delta)
    assert not bad.ok and len(bad.problems) == 2
    assert any("prompt tokens" in p for p in bad.problems) and any("TTFT" in p for p in bad.problems)


def test_missing_metrics_are_problems() -> None:
    result = check_agreement(group(1, 1, 104.0), parse_server_metrics(AFTER), MetricNames(prompt_tokens="x"))
    assert result.problems == ("server exposes no prompt tokens metric", "output tokens: client 1, server 90")


def test_not_prometheus_text() -> None:
    with pytest.raises(ValueError):
        parse_server_metrics("this is { not metrics")
