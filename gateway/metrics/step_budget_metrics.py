"""`/metrics` gauges of the scheduler's step budget (engine/scheduling/step_budget.py), read at scrape time.

- `weir_scheduler_token_budget`: the token budget of the last scheduled step.
- `weir_scheduler_target_step_seconds`: the target step time; 0 when none is set (fixed budget).
- `weir_scheduler_step_cost_per_token_seconds`, `weir_scheduler_step_cost_per_decode_seconds`,
  `weir_scheduler_step_overhead_seconds`: the fitted `step time ~ overhead + cost per decode *
  decodes + cost per token * prefill tokens`; absent until the engine has measured it.
- `weir_scheduler_step_margin`: the relative slack the budget plans under the target (twice the
  recent RMS miss of the fitted step time).
- `weir_scheduler_step_fit_resets_total`: fits dropped because steps kept taking under half their
  fitted time (a fit made of a stalled step); the engine fitted again from fresh steps.
- `weir_scheduler_step_fit_refits_total`: fits refitted because their steps drifted (several
  steps in a row all slower or all faster than fitted: a neighbour came or went,
  engine/scheduling/step_cost_drift.py); the fitted coefficients above are the refitted ones.
- `weir_scheduler_stretched_steps_total`: steps the scheduler planned longer than the tightest ITL
  target running, because that saved more first tokens than it broke streams still meeting both
  targets, or fed prompts already late where every row overran anyway (engine/scheduling/slo_trade.py).
- `weir_scheduler_max_running`: how many sequences the target step time lets run at once;
  absent without a target or before the cost is measured (then only `--max-num-seqs` caps).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.scheduling.step_budget import StepBudgetStats


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
    yield GaugeMetricFamily(
        "weir_scheduler_step_margin",
        "Relative slack under the target the budget plans for (twice the recent RMS miss of the fit).",
        value=stats.margin,
    )
    yield CounterMetricFamily(
        "weir_scheduler_step_fit_resets",
        "Step cost fits dropped because steps kept taking under half their fitted time; fitted again.",
        value=stats.num_fit_resets,
    )
    yield CounterMetricFamily(
        "weir_scheduler_step_fit_refits",
        "Step cost fits refitted because several steps in a row ran slower (or faster) than fitted.",
        value=stats.num_fit_refits,
    )
    yield CounterMetricFamily(
        "weir_scheduler_stretched_steps",
        "Steps planned longer than the tightest ITL target running, for first tokens (the goodput trade).",
        value=stats.num_stretched_steps,
    )
    if stats.max_running is not None:
        yield GaugeMetricFamily(
            "weir_scheduler_max_running",
            "Sequences the target step time lets run at once (every decode plus a minimum prefill chunk fits).",
            value=stats.max_running,
        )
    if stats.cost is None:
        return
    yield GaugeMetricFamily(
        "weir_scheduler_step_cost_per_token_seconds",
        "Fitted engine step cost per prefill token (step time ~ overhead + decode cost * decodes"
        " + token cost * prefill tokens).",
        value=stats.cost.per_token_s,
    )
    yield GaugeMetricFamily(
        "weir_scheduler_step_cost_per_decode_seconds",
        "Fitted engine step cost per decode row (its token, attention over its context, logits).",
        value=stats.cost.per_decode_s,
    )
    yield GaugeMetricFamily(
        "weir_scheduler_step_cost_per_context_token_seconds",
        "Fitted engine step cost per context token a decode row attends over (attention grows with context).",
        value=stats.cost.per_context_token_s,
    )
    yield GaugeMetricFamily(
        "weir_scheduler_step_overhead_seconds",
        "Fitted engine step overhead (the part of a step's time that does not grow with its tokens).",
        value=stats.cost.overhead_s,
    )
