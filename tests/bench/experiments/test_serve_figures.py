"""weir_bench.experiments.serve_figures: guidellm's report parsed, the server's metrics page read (garbage
collections, decode against prefill steps, admissions per tenant class), ratios and their tables, one round and several."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from weir_bench.experiments.serve_figures import (
    ServeFigures,
    admitted_by_class,
    gc_pause_totals,
    goodput,
    markdown,
    opening_burst,
    opening_window,
    over_rounds,
    parse_guidellm,
    ratios,
    rounds_markdown,
    step_split,
    wide_step_choices,
)


def _summary(median: float, mean: float, p99: float) -> dict:
    return {"successful": {"mean": mean, "median": median, "percentiles": {"p50": median, "p99": p99}}}


def test_parse_guidellm_reads_the_issue_figures() -> None:
    report = {
        "benchmarks": [
            {
                "metrics": {
                    "request_totals": {"successful": 47, "errored": 1, "incomplete": 0, "total": 48},
                    "output_tokens_per_second": _summary(40.0, 42.1, 60.0),
                    "inter_token_latency_ms": _summary(152.0, 160.0, 400.0),
                    "time_to_first_token_ms": _summary(2468.0, 2000.0, 5000.0),
                }
            }
        ]
    }
    got = parse_guidellm("weir", report, 91.23)
    assert got == ServeFigures("weir", 42.1, 152.0, 400.0, 2468.0, 5000.0, 47, 1, 91.2)


def _request(ttft_ms: float, itl_ms: float) -> dict:
    return {"time_to_first_token_ms": ttft_ms, "inter_token_latency_ms": itl_ms}


def test_goodput_counts_requests_within_both_targets_over_all_requests() -> None:
    requests = {
        "successful": [_request(500, 50), _request(2000, 100), _request(2001, 50), _request(100, 101)],
        "errored": [{}],
        "incomplete": [],
    }
    report = {"benchmarks": [{"requests": requests}]}
    assert goodput(report) == pytest.approx(2 / 5)  # the failed request is a miss too
    assert goodput(report, ttft_ms=3000, itl_ms=200) == pytest.approx(4 / 5)
    assert goodput({"benchmarks": [{}]}) is None


def _sent(start: float, ttft_ms: float | None) -> dict:
    return {"time_to_first_token_ms": ttft_ms, "info": {"timings": {"request_start": start}}}


def test_the_opening_burst_is_what_was_sent_together_at_the_start() -> None:
    burst = [_sent(100.0 + i / 100, ttft) for i, ttft in enumerate([300, 1900, 2100, 4000])]
    later = [_sent(104.0, 100), _sent(105.0, 100)]
    report = {"benchmarks": [{"requests": {"successful": burst + later, "errored": [_sent(100.2, None)]}}]}
    # five sent within 0.5 s of the first (the refused one too), two of them in time
    assert opening_burst(report) == {"burst_size": 5.0, "burst_within": 2.0}
    assert opening_burst(report, ttft_ms=5000) == {"burst_size": 5.0, "burst_within": 4.0}
    assert opening_burst({"benchmarks": [{}]}) == {}
    row = replace(
        ServeFigures("weir", 1, 1, 1, 1, 1, 1, 0, 1),
        opening={
            "burst_size": 8,
            "burst_within": 6,
            "window_s": 3,
            "client_cpu_s": 1.25,
            "server_cpu_s": 4.5,
        },
    )
    assert (
        "weir opening burst: 6 of 8 first tokens within 2 s; in its first 3 s guidellm used 1.2 CPU-s and the server 4.5"
        in markdown([row], ["weir"], "cmd")
    )


def test_ratios_and_table() -> None:
    peer = ServeFigures("tserve", 32.6, 194.0, 300.0, 1341.0, 3000.0, 48, 0, 100.0)
    weir = ServeFigures(
        "weir", 65.2, 97.0, 150.0, 1341.0, 2000.0, 48, 0, 60.0, {"weir_scheduler_token_budget": 80.0}
    )
    assert ratios(weir, peer) == {"output_tok_s": 2.0, "itl_p50": 0.5, "ttft_p50": 1.0}
    text = markdown([peer, weir], ["weir"], "cmd")
    assert "| weir / tserve | 2.0 | 0.5 | 1.0 |" in text
    assert "token budget 80" in text and "fits dropped 0" in text


def test_gc_pause_totals_read_each_generation_from_a_metrics_page() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from weir.gateway.fleet.gc_pauses import GcPauseRecorder

    registry = CollectorRegistry()
    recorder = GcPauseRecorder(registry)
    recorder.pauses.labels(generation="2").observe(0.25)
    recorder.pauses.labels(generation="2").observe(0.5)
    recorder.pauses.labels(generation="0").observe(0.001)
    totals = gc_pause_totals(generate_latest(registry).decode())
    assert totals["gc2_count"] == 2 and totals["gc2_s"] == 0.75
    assert totals["gc0_count"] == 1 and "gc1_count" not in totals


def test_step_split_reads_the_engine_collectors_page() -> None:

    from weir.engine.engine_stats import EngineStats, StepTimeTotals
    from weir.gateway.metrics.engine_collectors import FleetStatsCollector

    times = StepTimeTotals(decode_steps=300, decode_seconds=10.5, prefill_steps=40, prefill_seconds=6.0)
    registry = CollectorRegistry()
    registry.register(FleetStatsCollector(lambda: {"m@v1": EngineStats(0, 0, 100, 50, 16, step_times=times)}))
    got = step_split(generate_latest(registry).decode())
    assert got == {"decode_steps": 300, "decode_step_ms": 35.0, "prefill_steps": 40, "prefill_step_ms": 150.0}
    assert step_split("") == {}


def _fig(system: str, tok_s: float, itl: float, ttft: float = 500.0, **gauges: float) -> ServeFigures:
    return ServeFigures(system, tok_s, itl, 2 * itl, ttft, 2 * ttft, 48, 0, 30.0, dict(gauges))


def test_rounds_are_summarised_by_the_median_of_their_ratios() -> None:
    rounds = [
        [_fig("llama", 100.0, 40.0), _fig("weir", 120.0, 44.0, decode_step_ms=30.0, decode_steps=300)],
        [_fig("llama", 110.0, 40.0), _fig("weir", 121.0, 36.0)],
        [_fig("llama", 100.0, 50.0), _fig("weir", 90.0, 45.0)],
    ]
    got = {r.name: r for r in over_rounds(rounds, ["weir"])}
    assert got["weir / llama output_tok_s"].values == (1.2, 1.1, 0.9)
    assert got["weir / llama itl_p50"].values == (1.1, 0.9, 0.9)
    assert got["weir / llama itl_p50"].median_met and got["weir / llama output_tok_s"].rounds_met == 2
    orders = [["llama", "weir"], ["weir", "llama"], ["llama", "weir"]]
    text = rounds_markdown(rounds, ["weir"], "cmd", orders)
    assert "## Round 2 (weir, llama)" in text and "## Over 3 rounds" in text
    assert (
        "weir / llama itl_p50: median 0.90 (0.90-1.10), target <= 1.0: met on the median; met in 2 of 3"
        in text
    )
    assert "weir steps: 300 decode-only, mean 30.0 ms" in text
    assert rounds_markdown(rounds[:1], ["weir"], "cmd", orders[:1]) == markdown(rounds[0], ["weir"], "cmd")


def test_a_peer_missing_from_a_round_is_left_out_of_the_summary() -> None:
    rounds = [[_fig("llama", 100.0, 40.0), _fig("weir", 120.0, 44.0)], [_fig("weir", 121.0, 36.0)]]
    assert over_rounds(rounds, ["weir"]) == []


def test_wide_step_choices_read_each_bucket_from_the_metrics_page() -> None:
    from weir.engine.engine_stats import StepThreadsStats
    from weir.gateway.metrics.step_threads_metrics import step_threads_metrics

    class _Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            yield from step_threads_metrics(
                StepThreadsStats(
                    decode_threads=1, wide_threads=2, choices=((8, 2), (128, 1)), num_wide_steps=5
                )
            )

    registry = CollectorRegistry()
    registry.register(_Collector())  # type: ignore[arg-type]
    page = generate_latest(registry).decode()
    assert wide_step_choices(page) == {"threads_8": 2.0, "threads_128": 1.0}
    fig = _fig("weir", 100.0, 40.0, decode_step_ms=30.0, threads_8=2.0, threads_128=1.0)
    assert "weir wide steps' threads at the end: 8+ rows 2, 128+ rows 1" in markdown([fig], ["weir"], "cmd")


def test_the_table_says_which_tenant_class_weir_was_measured_under() -> None:
    peer = _fig("llama", 100.0, 40.0)
    weir = replace(_fig("weir", 120.0, 44.0, admitted_interactive=48.0), tenant_class="interactive")
    text = markdown([peer, weir], ["weir"], "cmd")
    assert "| server | tenant class |" in text
    assert "| weir | interactive | 120.0 |" in text and "| llama | - | 100.0 |" in text
    assert "weir requests admitted by tenant class: interactive 48" in text


def test_admitted_by_class_sums_the_tenants_of_each_class() -> None:
    from weir.gateway.metrics.admission_metrics import AdmissionMetrics

    registry = CollectorRegistry()
    metrics = AdmissionMetrics(registry)
    for tenant, priority in [
        ("a", "interactive"),
        ("a", "interactive"),
        ("b", "interactive"),
        ("c", "batch"),
    ]:
        metrics.count_admitted(tenant, priority)
    page = generate_latest(registry).decode()
    assert admitted_by_class(page) == {"admitted_interactive": 3.0, "admitted_batch": 1.0}
    assert admitted_by_class("") == {}


def test_the_opening_window_starts_at_the_first_request_sent() -> None:
    report = {
        "benchmarks": [
            {
                "requests": {
                    "successful": [{"info": {"timings": {"request_start": t}}} for t in (12.0, 10.5, 30.0)]
                }
            }
        ]
    }
    assert opening_window(report, 3.0) == (10.5, 13.5)
    assert opening_window({"benchmarks": [{"requests": {}}]}) is None
