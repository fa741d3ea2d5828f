"""`/metrics` gauges of the scheduler's step budget (engine/step_budget.py), read at scrape time.

- `weir_scheduler_token_budget`: the token budget of the last scheduled step.
- `weir_scheduler_target_step_seconds`: the target step time; 0 when none is set (fixed budget).
- `weir_scheduler_step_cost_per_token_seconds`, `weir_scheduler_step_overhead_seconds`: the fitted
  `step time ~ overhead + cost per token * tokens`; absent until the engine has measured it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from engine.step_budget import StepBudgetStats


def step_budget_metrics(stats: StepBudgetStats | None) -> Iterator[Metric]:
    """The step-budget gauges of one engine snapshot (nothing for an engine that reports none)."""
    if stats is None:
        return
    yield GaugeMetricFamily(
        "weir_scheduler_token_budget",
        "Tokens the scheduler allowed in the last step (fixed, or from the target step time).",
        value=stats.token_budget,
    )
    yield GaugeMetricFamily(
        "weir_scheduler_target_step_seconds",
        "Target engine step time the token budget follows; 0: none (fixed budget).",
        value=stats.target_step_s or 0.0,
    )
    if stats.cost is None:
        return
    yield GaugeMetricFamily(
        "weir_scheduler_step_cost_per_token_seconds",
        "Fitted engine step cost per scheduled token (step time ~ overhead + cost * tokens).",
        value=stats.cost.per_token_s,
    )
    yield GaugeMetricFamily(
        "weir_scheduler_step_overhead_seconds",
        "Fitted engine step overhead (the part of a step's time that does not grow with its tokens).",
        value=stats.cost.overhead_s,
    )
