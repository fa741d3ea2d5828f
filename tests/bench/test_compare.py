"""weir_bench.compare and `bench compare`: ratios per metric."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from weir_bench.cli import main
from weir_bench.compare import Verdict, compare_reports, load_report


def report(ttft_p50: float, tok_s: float) -> dict:
    lat = {"p50": 10.0, "p90": 20.0, "p99": 30.0, "mean": 12.0}
    group = {
        "requests": 10, "ok": 10, "cancelled": 0, "errors_by_status": {}, "ttft_ms": {**lat, "p50": ttft_p50},
        "tpot_ms": dict(lat), "itl_ms": dict(lat), "e2e_ms": dict(lat), "requests_per_s": 2.0,
        "output_tokens_per_s": tok_s, "prompt_tokens": 100, "output_tokens": 50, "goodput": 2.0,
        "good_requests": 10, "slo_attainment": 1.0,
    }  # fmt: skip
    return {"overall": group, "tenants": {"acme": copy.deepcopy(group)}, "metadata": {}}


def test_ratios_and_verdicts() -> None:
    rows = {(r.group, r.metric): r for r in compare_reports(report(100.0, 50.0), report(50.0, 100.0))}
    ttft = rows[("overall", "ttft_ms.p50")]
    assert (ttft.a, ttft.b, ttft.ratio, ttft.verdict) == (100.0, 50.0, 0.5, Verdict.BETTER)
    tok = rows[("tenant:acme", "output_tokens_per_s")]
    assert (tok.ratio, tok.verdict) == (2.0, Verdict.BETTER)
    assert rows[("overall", "itl_ms.p99")].verdict is Verdict.SAME
    assert rows[("overall", "requests_per_s")].ratio == 1.0
    worse = {(r.group, r.metric): r for r in compare_reports(report(50.0, 100.0), report(100.0, 50.0))}
    assert worse[("overall", "ttft_ms.p50")].verdict is Verdict.WORSE


def test_missing_values_give_no_ratio() -> None:
    a, b = report(100.0, 50.0), report(100.0, 50.0)
    a["overall"]["ttft_ms"]["p50"] = None
    b["overall"]["output_tokens_per_s"] = 0.0
    a["overall"]["goodput"] = 0.0
    rows = {r.metric: r for r in compare_reports(a, b) if r.group == "overall"}
    assert rows["ttft_ms.p50"].ratio is None and rows["ttft_ms.p50"].verdict is Verdict.NA
    assert rows["goodput"].ratio is None and rows["output_tokens_per_s"].ratio == 0.0


def test_compare_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(report(100.0, 50.0)))
    (tmp_path / "b.json").write_text(json.dumps(report(80.0, 60.0)))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    line = next(x for x in table.splitlines() if x.startswith("overall") and "ttft_ms.p50" in x)
    assert line.split()[2:] == ["100", "80", "0.8", "better"]
    data = json.loads(out.read_text())
    assert data["groups"]["overall"]["output_tokens_per_s"] == {
        "a": 50.0,
        "b": 60.0,
        "ratio": 1.2,
        "verdict": "better",
    }
    assert set(data["groups"]) == {"overall", "tenant:acme"}


def test_compare_rejects_what_is_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.json").write_text("[]")
    assert main(["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not a bench serve report" in capsys.readouterr().err
    with pytest.raises(ValueError):
        load_report(tmp_path / "x.json")
