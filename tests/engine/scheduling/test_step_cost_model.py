"""The step cost model (engine/scheduling/step_cost_model.py) on simulated step times.

The budget that plans from the fit, and the fit's resets seen through it, are tested in
test_step_budget.py; the drift refit in test_step_cost_drift.py.
"""

from __future__ import annotations

import pytest

from tests.engine.scheduling.test_step_budget import FakeCost
from weir.engine.scheduling.step_cost_model import StepCostModel


def test_the_slope_stands_while_every_step_has_the_same_size() -> None:
    model = StepCostModel(forgetting=0.9, ridge=32.0**2)
    cost = FakeCost(a=0.04, b=0.002, noise=0.0)
    for tokens in (64, 128, 256, 8, 400):
        model.observe(tokens, cost.seconds(tokens))
    for _ in range(300):  # decodes only, on a machine whose overhead grew: the slope is unknown to them
        model.observe(8, 0.06 + 0.002 * 8)
    fitted = model.cost
    assert fitted is not None
    assert fitted.per_token_s == pytest.approx(0.002, rel=0.05)
    assert fitted.overhead_s == pytest.approx(0.06, rel=0.05)
