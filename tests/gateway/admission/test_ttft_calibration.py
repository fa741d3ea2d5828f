"""The TTFT predictions' calibration: per class and per tenant, from the ratios admitted requests reported."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from weir.engine.request import Priority
from weir.gateway.admission.slo import TTFTPrediction
from weir.gateway.admission.ttft_calibration import (
    MAX_FACTOR,
    MIN_FACTOR,
    MIN_PREDICTED_S,
    MIN_SAMPLES,
    TTFTCalibration,
)


def test_no_factor_until_enough_reports_then_their_ratio() -> None:
    cal = TTFTCalibration()
    for _ in range(MIN_SAMPLES - 1):
        cal.observe(Priority.INTERACTIVE, predicted_s=3.0, actual_s=2.0)
    assert cal.state(Priority.INTERACTIVE).factor == 1.0
    cal.observe(Priority.INTERACTIVE, predicted_s=3.0, actual_s=2.0)
    state = cal.state(Priority.INTERACTIVE)
    assert state.samples == MIN_SAMPLES and math.isclose(state.factor, 2 / 3)
    scaled = cal.apply(Priority.INTERACTIVE, TTFTPrediction(3.0, 100, 50.0))
    assert math.isclose(scaled.seconds, 2.0) and scaled.tokens_ahead == 100


def test_classes_are_calibrated_apart() -> None:
    cal = TTFTCalibration()
    for _ in range(MIN_SAMPLES):
        cal.observe(Priority.INTERACTIVE, 1.0, 0.5)
        cal.observe(Priority.BATCH, 1.0, 2.0)
    assert math.isclose(cal.state(Priority.INTERACTIVE).factor, 0.5)
    assert math.isclose(cal.state(Priority.BATCH).factor, 2.0)
    assert cal.state(Priority.STANDARD).factor == 1.0


def test_the_factor_follows_a_changed_bias() -> None:
    cal = TTFTCalibration()
    for _ in range(MIN_SAMPLES):
        cal.observe(Priority.INTERACTIVE, 2.0, 1.0)
    for _ in range(40):  # the machine got slower: predictions now run short
        cal.observe(Priority.INTERACTIVE, 1.0, 1.5)
    assert math.isclose(cal.state(Priority.INTERACTIVE).factor, 1.5, rel_tol=0.01)


def test_a_tenant_gets_its_own_factor_and_only_the_lenient_side_of_its_class() -> None:
    cal = TTFTCalibration()
    for _ in range(MIN_SAMPLES):  # a tenant whose first tokens come twice as late as predicted
        cal.observe(Priority.INTERACTIVE, 1.0, 2.0, tenant="late")
    assert math.isclose(cal.state(Priority.INTERACTIVE).factor, 2.0)  # the class's (the gauge)
    assert math.isclose(cal.state(Priority.INTERACTIVE, "late").factor, 2.0)  # its own
    assert cal.state(Priority.INTERACTIVE, "other").factor == 1.0  # not another tenant's
    for _ in range(3 * MIN_SAMPLES):  # others' first tokens come early: the class turns lenient
        cal.observe(Priority.INTERACTIVE, 1.0, 0.25, tenant="early")
    assert cal.state(Priority.INTERACTIVE).factor < 1.0
    newcomer = cal.state(Priority.INTERACTIVE, "new")
    assert newcomer.factor == cal.state(Priority.INTERACTIVE).factor and newcomer.samples == 0
    assert math.isclose(cal.state(Priority.INTERACTIVE, "late").factor, 2.0)  # its own still
    assert cal.state(Priority.STANDARD, "late").factor == 1.0  # classes apart per tenant too
    scaled = cal.apply(Priority.INTERACTIVE, TTFTPrediction(1.0, 0, 1.0), "late")
    assert math.isclose(scaled.seconds, 2.0)


def test_the_tenants_remembered_are_bounded() -> None:
    cal = TTFTCalibration(max_tenants=2)
    for name in ("a", "b", "c"):
        for _ in range(MIN_SAMPLES):
            cal.observe(Priority.INTERACTIVE, 1.0, 2.0, tenant=name)
    assert cal.state(Priority.INTERACTIVE, "a").samples == 0  # evicted: back to the class's side
    assert cal.state(Priority.INTERACTIVE, "c").samples == MIN_SAMPLES


def test_tiny_predictions_and_nonsense_are_not_reports() -> None:
    cal = TTFTCalibration()
    for predicted, actual in [(MIN_PREDICTED_S / 2, 1.0), (1.0, 0.0), (1.0, math.nan), (math.inf, 1.0)]:
        for _ in range(MIN_SAMPLES):
            cal.observe(Priority.INTERACTIVE, predicted, actual)
    assert cal.state(Priority.INTERACTIVE).samples == 0


@given(st.lists(st.tuples(st.floats(0.0, 1e6), st.floats(0.0, 1e6)), max_size=50))
def test_the_factor_stays_within_its_bounds(reports: list[tuple[float, float]]) -> None:
    cal = TTFTCalibration()
    for predicted, actual in reports:
        cal.observe(Priority.INTERACTIVE, predicted, actual)
        factor = cal.state(Priority.INTERACTIVE).factor
        assert MIN_FACTOR <= factor <= MAX_FACTOR and math.isfinite(factor)
