"""weir_bench.report: figures of a known run and the exact JSON schema."""

from __future__ import annotations

import json

import pytest

from weir_bench.arrivals import ArrivalSpec
from weir_bench.loadgen import LoadOptions, LoadResult
from weir_bench.records import RequestRecord
from weir_bench.report import SLO, GroupReport, RunInfo, build_report, render_markdown

# The schema of report.json. Changing these sets breaks every stored report and `bench compare`:
# add keys (and update this test on purpose), never rename or drop them.
GROUP_KEYS = {
    "requests", "ok", "cancelled", "errors_by_status", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
    "requests_per_s", "output_tokens_per_s", "prompt_tokens", "output_tokens", "goodput",
    "good_requests", "slo_attainment",
}  # fmt: skip
LATENCY_KEYS = {"p50", "p90", "p99", "mean"}
METADATA_KEYS = {
    "schema_version", "date_utc", "command", "url", "model", "workload", "workload_sha256",
    "num_planned", "num_sent", "limit", "arrival", "slo", "timeout_s", "max_duration_s", "duration_s",
    "prompt_tokens", "output_tokens", "max_tokens", "batch_policy", "dtype", "server", "server_model",
    "labels", "tenant_keys", "machine", "git_commit",
}  # fmt: skip
DIST_KEYS = {"count", "min", "p50", "p90", "p99", "max", "mean"}
MACHINE_KEYS = {"cpu", "cores", "memory_gb", "gpus", "platform", "python", "hostname"}


def report_of(records: list[RequestRecord], slo: SLO = SLO()) -> dict:
    result = LoadResult(
        records=tuple(records), duration_s=4.0, started_at_unix=0.0, num_planned=len(records) + 1
    )
    info = RunInfo(
        url="http://127.0.0.1:1",
        model="m",
        workload="w.jsonl",
        arrival=ArrivalSpec(rate_scale=2.0),
        options=LoadOptions(),
        slo=slo,
        labels={"dtype": "bfloat16"},
        server_model={"id": "m", "batch_policy": "continuous", "dtype": "float32"},
        tenant_keys="per_tenant",
    )
    return build_report(result, info)


def test_json_schema_is_stable(sample_records: list[RequestRecord]) -> None:
    report = json.loads(json.dumps(report_of(sample_records)))
    assert set(report) == {"overall", "tenants", "metadata"}
    assert set(report["tenants"]) == {"acme", "globex"}
    for group in [report["overall"], *report["tenants"].values()]:
        assert set(group) == GROUP_KEYS
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(group[metric]) == LATENCY_KEYS
    meta = report["metadata"]
    assert set(meta) == METADATA_KEYS
    for key in ("prompt_tokens", "output_tokens", "max_tokens"):
        assert set(meta[key]) == DIST_KEYS
    assert set(meta["machine"]) == MACHINE_KEYS
    assert meta["arrival"] == {"mode": "trace", "rate_scale": 2.0}
    assert (meta["batch_policy"], meta["dtype"]) == ("continuous", "bfloat16")  # a label wins


def test_figures_of_a_known_run(sample_records: list[RequestRecord]) -> None:
    report = report_of(sample_records)
    overall = report["overall"]
    assert (overall["requests"], overall["ok"], overall["cancelled"]) == (10, 7, 1)
    assert overall["errors_by_status"] == {"429": 1, "500": 1, "connection_error": 1}
    assert overall["ttft_ms"]["p50"] == 100.0 and overall["ttft_ms"]["p99"] == pytest.approx(288.0)
    assert overall["itl_ms"] == {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": 20.0}
    assert overall["tpot_ms"]["mean"] == pytest.approx(20.25)  # (181 - 100) / 4
    assert overall["e2e_ms"]["p50"] == 181.0  # the cancelled request is not in E2E
    assert overall["output_tokens"] == 6 * 5 + 3 and overall["prompt_tokens"] == sum(10 + i for i in range(6))
    assert overall["output_tokens_per_s"] == pytest.approx(33 / 4.0)
    assert overall["requests_per_s"] == pytest.approx(7 / 4.0)
    assert overall["goodput"] == pytest.approx(6 / 4.0) and overall["slo_attainment"] == pytest.approx(0.6)
    assert report["tenants"]["globex"]["requests"] == 6 and report["tenants"]["globex"]["ok"] == 3


def test_goodput_applies_the_slos(sample_records: list[RequestRecord]) -> None:
    assert report_of(sample_records, SLO(ttft_ms=99.0))["overall"]["good_requests"] == 0
    assert report_of(sample_records, SLO(ttft_ms=100.0, tpot_ms=20.25))["overall"]["good_requests"] == 6
    assert report_of(sample_records, SLO(tpot_ms=20.0))["overall"]["goodput"] == 0.0
    with pytest.raises(ValueError, match="ttft_ms"):
        SLO(ttft_ms=0)


def test_empty_run_has_the_same_schema() -> None:
    group = GroupReport.of([], 0.0, SLO()).to_json()
    assert set(group) == GROUP_KEYS and group["ttft_ms"]["p50"] is None and group["slo_attainment"] is None


def test_markdown_has_every_group_and_plot(sample_records: list[RequestRecord]) -> None:
    md = render_markdown(report_of(sample_records), ["latency_cdf.png"])
    assert "| overall | 10 | 7 | 1 | 429: 1, 500: 1, connection_error: 1 |" in md
    assert "| acme | ttft_ms |" in md and "| globex | e2e_ms |" in md
    assert "![latency_cdf.png](latency_cdf.png)" in md and "continuous" in md
