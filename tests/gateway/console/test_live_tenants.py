"""Per-tenant live rows from a real GatewayMetrics: bucket percentiles and throughput between reads."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.gateway.console.live_tenants import LiveTenants, histogram_quantile, slo_attainment
from weir.gateway.metrics.admission_metrics import AdmissionMetrics, SLOResult
from weir.gateway.metrics.registry import GatewayMetrics


def test_quantiles_interpolate_within_a_bucket_like_promql() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (0.4, 20.0), (math.inf, 20.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.99, [(0.1, 0.0), (math.inf, 5.0)]) == 0.1  # in +Inf: the last bound


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12), st.floats(0.0, 1.0))
def test_a_quantile_lies_within_the_histograms_bounds(counts: list[int], q: float) -> None:
    bounds = [0.01 * 2**i for i in range(len(counts))]
    cumulative, total = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        cumulative.append((bound, float(total)))
    value = histogram_quantile(q, cumulative)
    if total == 0:
        assert value is None
    else:
        assert value is not None and 0.0 <= value <= bounds[-1]


def test_rows_per_model_and_tenant_with_percentiles_and_throughput() -> None:
    now = [100.0]
    metrics = GatewayMetrics(None)
    live = LiveTenants(metrics, timer=lambda: now[0])
    assert live.rows() == []
    for ttft in (0.01, 0.02, 0.03, 0.5):
        metrics.observe_latency(
            "m", "acme", ttft_s=ttft, tpot_s=None, e2e_s=None, queue_s=None, itl_s=(0.01,)
        )
    metrics.count_tokens("m", "acme", prompt=5, cached=0, generated=40)
    metrics.count_finished("m", "acme", "stop")
    metrics.count_tokens("m", "other", prompt=5, cached=0, generated=1)
    first = {(r.model, r.tenant): r for r in live.rows()}
    acme = first[("m", "acme")]
    assert acme.requests == 1 and acme.generated_tokens == 40 and acme.tokens_per_s is None
    assert acme.ttft_p50_s is not None and acme.ttft_p95_s is not None
    assert 0.0 < acme.ttft_p50_s <= acme.ttft_p95_s
    assert acme.itl_p50_s is not None and acme.itl_p50_s <= 0.025
    assert first[("m", "other")].ttft_p50_s is None and first[("m", "other")].cells()["ttft_p50"] == "-"
    now[0] += 2.0
    metrics.count_tokens("m", "acme", prompt=0, cached=0, generated=60)
    again = {(r.model, r.tenant): r for r in live.rows()}
    # Since the first read (t=100, nothing yet): 40 + 60 tokens over 2 s.
    assert again[("m", "acme")].tokens_per_s == pytest.approx(50.0)
    assert again[("m", "other")].tokens_per_s == pytest.approx(0.5)
    now[0] += 0.1  # too soon for a new rate: the previous one stays
    assert {(r.model, r.tenant): r for r in live.rows()}[("m", "acme")].tokens_per_s == pytest.approx(50.0)
    assert again[("m", "acme")].cells()["tokens_per_s"] == "50.0"
    now[0] += 1.0  # nothing more generated: the rate drops to 0
    assert {(r.model, r.tenant): r for r in live.rows()}[("m", "acme")].tokens_per_s == 0.0


def test_slo_attainment_per_tenant_from_admissions_counter() -> None:
    metrics = GatewayMetrics(None)
    admission = AdmissionMetrics(metrics.registry)
    live = LiveTenants(metrics)
    for result in (SLOResult.MET, SLOResult.MET, SLOResult.MET, SLOResult.MISSED):
        admission.count_slo("acme", result)
    metrics.count_tokens("m", "acme", prompt=1, cached=0, generated=1)
    metrics.count_tokens("m", "other", prompt=1, cached=0, generated=1)
    rows = {r.tenant: r for r in live.rows()}
    assert rows["acme"].slo_met == pytest.approx(0.75) and rows["acme"].cells()["slo_met"] == "75.0%"
    assert rows["other"].slo_met is None and rows["other"].cells()["slo_met"] == "-"
    assert slo_attainment(GatewayMetrics(None).registry) == {}  # admission off: no counter
