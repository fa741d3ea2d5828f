"""weir_bench.experiments.console_load at a small size: it fills, measures every page and chart query
(rollup-backed and, with --compare-raw, over the raw records) and writes its summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from weir_bench.experiments import console_load


def test_a_small_run_measures_every_page_and_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["console_load", "--out", str(tmp_path), "--tenants", "4", "--records", "300", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--compare-raw", "--time-backfill"])
    assert console_load.main() == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dialect"] == "sqlite" and summary["records"] == 300
    assert {"usage heaviest (90 d, by user)", "usage.csv median (90 d)", "audit"} <= summary["pages"].keys()
    queries = summary["chart_queries"]
    assert "usage_report by user heaviest 90 d" in queries
    assert "usage_report by user heaviest 90 d (raw records)" in queries
    assert all(v["first_ms"] >= 0 and v["median_ms"] >= 0 for v in queries.values())
    assert "Chart queries" in (tmp_path / "summary.md").read_text()
    assert summary["backfill"]["sums_equal"] is True
