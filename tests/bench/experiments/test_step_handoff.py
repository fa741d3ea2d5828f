"""The step hand-off micro-benchmark runs, and its two hand-offs differ in loop callbacks only."""

from __future__ import annotations

import pytest

from weir_bench.experiments import step_handoff


def test_a_tiny_run_reports_one_callback_per_step_after(capsys: pytest.CaptureFixture[str]) -> None:
    step_handoff.main(["--streams", "4", "--steps", "5", "--rounds", "1", "--chunks", "10"])
    lines = capsys.readouterr().out.splitlines()
    before = next(line for line in lines if "before" in line and "callbacks" in line)
    after = next(line for line in lines if "after" in line and "callbacks" in line)
    assert before.endswith("4 loop callbacks/step")
    assert after.endswith("1 loop callbacks/step")
