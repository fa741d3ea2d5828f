"""The step-budget gauges on /metrics, from an engine snapshot (fixed budget, and with a target)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.metrics.engine_snapshot import engine_stats
from weir.engine.engine_stats import EngineStats
from weir.engine.scheduling.step_budget import StepBudgetStats
from weir.engine.scheduling.step_cost_model import StepCost
from weir.gateway.metrics.registry import GatewayMetrics


def _scrape(stats: EngineStats) -> dict[str, float]:
    text = GatewayMetrics(lambda: stats).render()[0].decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _stats(step_budget: StepBudgetStats | None) -> EngineStats:
    return engine_stats(step_budget=step_budget)


def test_the_budget_the_target_and_the_fitted_cost_are_gauges() -> None:
    cost = StepCost(overhead_s=0.04, per_token_s=0.002, per_decode_s=0.005)
    got = _scrape(
        _stats(
            StepBudgetStats(
                80,
                0.2,
                cost,
                max_running=22,
                margin=0.06,
                num_fit_resets=1,
                num_fit_refits=2,
                num_stretched_steps=5,
            )
        )
    )
    assert got["weir_scheduler_token_budget"] == 80
    assert got["weir_scheduler_target_step_seconds"] == 0.2
    assert got["weir_scheduler_step_cost_per_token_seconds"] == 0.002
    assert got["weir_scheduler_step_cost_per_decode_seconds"] == 0.005
    assert got["weir_scheduler_step_overhead_seconds"] == 0.04
    assert got["weir_scheduler_max_running"] == 22
    assert got["weir_scheduler_step_margin"] == 0.06
    assert got["weir_scheduler_step_fit_resets_total"] == 1
    assert got["weir_scheduler_step_fit_refits_total"] == 2
    assert got["weir_scheduler_stretched_steps_total"] == 5


def test_a_fixed_budget_shows_target_zero_and_no_cost_before_it_is_measured() -> None:
    got = _scrape(_stats(StepBudgetStats(2048, None, None)))
    assert got["weir_scheduler_token_budget"] == 2048
    assert got["weir_scheduler_target_step_seconds"] == 0.0
    assert "weir_scheduler_step_cost_per_token_seconds" not in got
    assert "weir_scheduler_max_running" not in got  # no target: only --max-num-seqs caps


def test_an_engine_without_a_step_budget_adds_no_gauges() -> None:
    assert not any(name.startswith("weir_scheduler_") for name in _scrape(_stats(None)))
