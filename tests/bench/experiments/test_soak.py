"""weir_bench.experiments.soak's report and weir_bench.hostile's probes, without a server."""

from __future__ import annotations

import argparse
import json
import time

from weir_bench.experiments.soak import Minute, Soak, markdown, summarize
from weir_bench.hostile import HOSTILE, Target


def test_every_probe_builds_a_request() -> None:
    target = Target("http://127.0.0.1:1", "m", "sk-weir-x", kv_cache_tokens=64)
    names = set()
    for probe in HOSTILE:
        path, headers, body = probe.build(target)
        assert path.startswith("/")
        assert "authorization" in headers
        names.add(probe.name)
    assert len(names) == len(HOSTILE)
    # Lone surrogates travel as JSON escapes, as a client writes them.
    (surrogate,) = [p for p in HOSTILE if p.name == "surrogate_prompt"]
    assert b"\\ud800" in surrogate.build(target)[2]
    (fits,) = [p for p in HOSTILE if p.name == "never_fits"]
    assert json.loads(fits.build(target)[2])["max_tokens"] == 16


def test_summary_counts_minutes_and_rss_growth() -> None:
    args = argparse.Namespace(duration_s=120.0, workers=2, tenants=1, max_requests=10)
    soak = Soak.__new__(Soak)
    soak.args, soak.num_sent, soak.t0 = args, 5, time.monotonic()
    soak.minutes = {
        0: Minute(rss=[100 * 2**20, 110 * 2**20], ttft_s=[0.1, 0.2], e2e_s=[1.0, 2.0]),
        1: Minute(rss=[111 * 2**20], ttft_s=[0.3], e2e_s=[1.5]),
    }
    soak.minutes[0].outcomes.update({"stream_ok": 2, "seed_2_64_4xx": 1})
    soak.minutes[1].outcomes.update({"stream_ok": 1, "stream_5xx": 1})
    report = summarize(soak, {"idle": 1.0}, rss_after=112 * 2**20)
    assert report["num_5xx"] == 1
    assert report["rss_mib"]["after_first_minute"] == 110.0
    assert report["rss_mib"]["growth_after_first_minute"] == 2.0
    assert [m["minute"] for m in report["minutes"]] == [1, 2]
    assert report["minutes"][0]["ttft_ms"]["p50"] == 150.0
    text = markdown(report)
    assert "| 2 | 1 | 0 | 0 | 1 |" in text
