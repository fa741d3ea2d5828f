"""The step cost drift detector (engine/scheduling/step_cost_drift.py) and the refit it triggers in the step
cost model (engine/scheduling/step_cost_model.py), on simulated step times."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.engine.scheduling.test_step_budget import FakeCost
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig
from weir.engine.scheduling.step_cost_drift import DRIFT_STEPS, DriftDetector, ObservedStep


def _step(seconds: float) -> ObservedStep:
    return ObservedStep((1.0, 8.0, 0.0, 0.0), seconds)


def test_steps_in_a_row_all_faster_than_fitted_are_a_drift() -> None:
    det = DriftDetector()
    got = [det.observe(_step(0.05), 0.1) for _ in range(DRIFT_STEPS)]
    assert got[:-1] == [None] * (DRIFT_STEPS - 1)
    drift = got[-1]
    assert drift is not None
    assert drift.factor == pytest.approx(0.5)
    assert len(drift.steps) == DRIFT_STEPS
    assert det.observe(_step(0.05), 0.1) is None  # counting starts over after a drift


@given(st.floats(min_value=0.0, max_value=1e-300), st.floats(min_value=1e-9, max_value=1e9))
def test_a_time_too_small_to_compare_is_ignored(seconds: float, predicted_s: float) -> None:
    # 5e-324 s over a 2 s prediction underflows to a ratio of 0 (found by the step budget's state
    # machine): such a step is ignored; any other tiny step is a step much faster than fitted.
    det = DriftDetector()
    drifts = [det.observe(_step(seconds), predicted_s) for _ in range(DRIFT_STEPS)]
    if seconds / predicted_s == 0.0:
        assert drifts == [None] * DRIFT_STEPS
    else:
        assert drifts[-1] is not None and drifts[-1].factor < 1.0


def test_a_step_within_tolerance_or_the_other_way_breaks_the_run() -> None:
    det = DriftDetector()
    for _ in range(DRIFT_STEPS - 1):
        assert det.observe(_step(0.2), 0.1) is None
    assert det.observe(_step(0.05), 0.1) is None  # faster: a new run of one
    for _ in range(DRIFT_STEPS - 2):
        assert det.observe(_step(0.05), 0.1) is None
    assert det.observe(_step(0.1), 0.1) is None  # on the fit: no run at all
    for _ in range(DRIFT_STEPS - 1):
        assert det.observe(_step(0.2), 0.1) is None
    drift = det.observe(_step(0.2), 0.1)
    assert drift is not None and drift.factor == pytest.approx(2.0)


@given(st.lists(st.floats(min_value=-0.15, max_value=0.15), min_size=1, max_size=200))
def test_noise_within_the_tolerance_is_never_a_drift(errors: list[float]) -> None:
    det = DriftDetector()
    assert all(det.observe(_step(0.1 * (1 + e * 0.999)), 0.1) is None for e in errors)


@given(st.lists(st.floats(min_value=0.2, max_value=5.0), min_size=DRIFT_STEPS, max_size=DRIFT_STEPS))
def test_any_run_of_slow_steps_is_a_drift_by_their_mean_ratio(ratios: list[float]) -> None:
    det = DriftDetector()
    slow = [1.0 + r for r in ratios]
    drifts = [det.observe(_step(0.1 * r), 0.1) for r in slow]
    drift = drifts[-1]
    assert drift is not None and min(slow) * (1 - 1e-9) <= drift.factor <= max(slow) * (1 + 1e-9)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        DriftDetector(tolerance=0.0)
    with pytest.raises(ValueError, match="run"):
        DriftDetector(run=1)


def _decode_steps(ctrl: StepBudget, cost: FakeCost, num_steps: int, rows: int = 8) -> None:
    """Steps of `rows` decodes and a 20-token chunk: one shape, which cannot move a slope."""
    for _ in range(num_steps):
        ctrl.observe(rows + 20, cost.seconds(rows + 20, rows), rows)


def test_a_fit_polluted_by_a_neighbour_recovers_when_the_machine_frees_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 58: the fit made while a neighbour loaded the machine (every part of a step 1.9x)
    kept its slopes after the load ended, every later step having one shape; only the overhead
    moved. (Steps under half their fitted time drop the fit instead: the reset tests.)"""
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.1))
    loaded = FakeCost(a=0.057, b=0.00285, c=0.0076, seed=1)
    for tokens, rows in [(64, 0), (128, 0), (40, 8), (16, 8)]:  # a start with varied shapes
        ctrl.observe(tokens, loaded.seconds(tokens, rows), rows)
    _decode_steps(ctrl, loaded, 30)
    polluted = ctrl.stats().cost
    assert polluted is not None and polluted.per_decode_s > 0.007
    cap_loaded = ctrl.max_running()
    with caplog.at_level(logging.INFO, logger="weir.engine.scheduling.step_cost_model"):
        _decode_steps(ctrl, FakeCost(a=0.03, b=0.0015, c=0.004, seed=2), 30)  # the neighbour left
    stats = ctrl.stats()
    assert stats.num_fit_refits >= 1
    assert stats.cost is not None
    assert stats.cost.per_decode_s == pytest.approx(0.004, rel=0.25)
    assert stats.cost.per_token_s == pytest.approx(0.0015, rel=0.25)
    # one shape cannot part the overhead from the slopes; the step of that shape is right
    assert stats.cost.seconds(28, 8) == pytest.approx(0.03 + 8 * 0.004 + 20 * 0.0015, rel=0.1)
    cap = ctrl.max_running()
    assert cap_loaded is not None and cap is not None and cap > 1.5 * cap_loaded
    refits = [r for r in caplog.records if "step cost drifted" in r.getMessage()]
    assert len(refits) == stats.num_fit_refits  # one log line per refit


def test_a_neighbour_arriving_is_followed_too() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.1))
    free = FakeCost(a=0.03, b=0.0015, c=0.004, seed=3)
    for tokens, rows in [(64, 0), (128, 0), (40, 8), (16, 8)]:
        ctrl.observe(tokens, free.seconds(tokens, rows), rows)
    _decode_steps(ctrl, free, 30)
    before = ctrl.stats().cost
    _decode_steps(ctrl, FakeCost(a=0.06, b=0.003, c=0.008, seed=4), 30)  # everything twice as slow
    cost = ctrl.stats().cost
    assert ctrl.stats().num_fit_refits >= 1
    assert before is not None and cost is not None
    assert cost.per_decode_s > 1.5 * before.per_decode_s  # the slope followed, not the overhead alone
    assert cost.seconds(28, 8) == pytest.approx(2 * (0.03 + 8 * 0.004 + 20 * 0.0015), rel=0.1)


def test_a_steady_machine_is_never_refitted() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.1))
    cost = FakeCost(a=0.03, b=0.0015, c=0.004, seed=5, noise=0.1)
    for tokens, rows in [(64, 0), (128, 0), (40, 8), (16, 8)]:
        ctrl.observe(tokens, cost.seconds(tokens, rows), rows)
    _decode_steps(ctrl, cost, 300)
    assert ctrl.stats().num_fit_refits == 0
