"""weir_bench.experiments.rollout's report: errors, TTFT per phase and their ratio, first v2 token, memory."""

from __future__ import annotations

import argparse

from weir_bench.experiments.rollout import Record, _markdown, summarize

MIB = 2**20


def _marks() -> dict[str, object]:
    return {
        "load_start": 100.0,
        "load_done": 104.0,
        "split_10": 105.0,
        "retire_start": 150.0,
        "switch_end": 151.0,
        "rss_before_load": 500 * MIB,
        "rss_after_load": 1100 * MIB,
        "rss_before_retire": 1100 * MIB,
        "rss_after_retire": 600 * MIB,
        "retire_released_bytes": 550 * MIB,
        "retire_freed_bytes": 480 * MIB,
    }


def test_phases_ratio_first_v2_token_and_memory() -> None:
    args = argparse.Namespace(warmup_s=10.0, out=None, rate=1.0)
    records = [Record(float(t), 200, True, 0.1, "v1") for t in range(10, 100)]  # steady, from t0 + warm-up
    records += [Record(1.0, 200, True, 9.0, "v1")]  # inside the warm-up: not counted
    records += [Record(float(t), 200, True, 0.2, "v2") for t in range(106, 150)]  # the switch
    records += [Record(120.0, 503, False, None, "v2")]
    records += [
        Record(float(t), 200, True, 0.1, "v2") for t in range(160, 200)
    ]  # after the switch (from 156 s)
    s = summarize(records, _marks(), 0.0, args)  # type: ignore[arg-type]
    assert s["errors"] == 1 and s["by_version"] == {"v1": 91, "v2": 85}
    assert s["ttft_steady_ms"]["p99"] == 100.0 and s["ttft_switch_ms"]["p99"] == 200.0
    assert (
        s["ttft_p99_ratio"] == 2.0
        and s["ttft_after_ms"]["p99"] == 100.0
        and s["ttft_p99_ratio_vs_after"] == 2.0
    )
    assert abs(s["load_to_first_v2_token_s"] - 6.2) < 1e-9 and s["load_call_s"] == 4.0
    assert s["rss_freed_by_retire_mib"] == 500.0 and s["retire_measured_freed_mib"] == 480.0
    assert "| requests / errors | 176 / 1 |" in _markdown(s)
