"""The engine's measured rates: moving averages of prefill and decode steps, and prefill estimates."""

from __future__ import annotations

import pytest

from weir.engine.measured_rates import MeasuredRates, RateMeter
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig


def test_a_rate_meter_starts_at_its_first_sample_then_averages() -> None:
    meter = RateMeter(alpha=0.5)
    meter.add(0, 1.0)  # nothing measured: ignored
    meter.add(10, 0.0)
    assert meter.samples == 0 and meter.value == 0.0
    meter.add(100, 1.0)
    meter.add(300, 1.0)
    assert meter.samples == 2 and meter.value == pytest.approx(200.0)


def test_a_step_with_prompt_tokens_measures_prefill_else_decode() -> None:
    rates = MeasuredRates(StepBudget(StepBudgetConfig(max_tokens=512)))
    rates.observe(128, 0.25)
    rates.observe(0, 0.05)
    assert rates.prefill.value == pytest.approx(512.0) and rates.decode.value == pytest.approx(20.0)
    rates.forget()
    assert rates.prefill.samples == rates.decode.samples == 0


def test_prefill_seconds_use_the_measured_rate_before_the_step_cost_is_fitted() -> None:
    budget = StepBudget(StepBudgetConfig(max_tokens=512))
    rates = MeasuredRates(budget)
    assert budget.model.cost is None and rates.prefill_seconds(100) == 0.0  # nothing known yet
    rates.observe(200, 0.5)
    assert rates.prefill_seconds(100) == pytest.approx(0.25)
