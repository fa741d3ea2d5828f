"""weir_bench.experiments.prefill_attention: both paths agree, and a run reports each shape's times and ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weir_bench.experiments import prefill_attention


def test_a_run_reports_each_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = prefill_attention.main(
        ["--shapes", "8x8", "16x40", "--reps", "2", "--inner", "1", "--out", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert [(r["chunk"], r["context"]) for r in report["rows"]] == [(8, 8), (16, 40)]
    for row in report["rows"]:
        assert row["oracle_ms"] > 0 and row["split_ms"] > 0
        assert row["oracle_over_split"] == pytest.approx(row["oracle_ms"] / row["split_ms"], rel=0.02)
        assert row["max_abs_diff"] < 1e-5
    assert json.loads(capsys.readouterr().out) == report


def test_a_shape_that_is_no_chunk_is_refused() -> None:
    with pytest.raises(SystemExit):
        prefill_attention.main(["--shapes", "10x5"])
