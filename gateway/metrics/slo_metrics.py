"""`/metrics` of the engine's own SLO accounting (engine/scheduling/slo_tally.py), read at scrape time.

- `weir_engine_slo_sequences_total{priority, tenant, target, result}`: finished sequences judged
  against their TTFT (`target="ttft"`) or ITL (`target="itl"`, mean inter-token time) target,
  `result` met or missed: the goodput per class and tenant. Sequences without a target are not
  counted.
- `weir_engine_preemptions_by_reason_total{reason}`: preemptions, by why (kv_exhausted, class,
  slo, stall, requeue).
- `weir_scheduler_step_target_seconds`: the time target of the last step (the tightest ITL
  target running, else the throughput target); absent when the step had none.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.scheduling.slo_tally import SloStats
from weir.engine.scheduling.step_budget import StepBudgetStats
from weir.gateway.metrics.scrape_families import labelled


def slo_metrics(stats: SloStats, step_budget: StepBudgetStats | None) -> Iterator[Metric]:
    """The SLO counters of one engine snapshot, and the last step's target."""
    judged = CounterMetricFamily(
        "weir_engine_slo_sequences",
        "Finished sequences judged against their TTFT or ITL target (engine accounting), met or missed.",
        labels=["priority", "tenant", "target", "result"],
    )
    for c in stats.counts:
        prio = c.priority.name.lower()
        for target, met, missed in (("ttft", c.ttft_met, c.ttft_missed), ("itl", c.itl_met, c.itl_missed)):
            if met or missed:
                judged.add_metric([prio, c.tenant_id, target, "met"], met)
                judged.add_metric([prio, c.tenant_id, target, "missed"], missed)
    yield judged
    yield labelled(
        CounterMetricFamily,
        "weir_engine_preemptions_by_reason",
        "Running requests preempted, by reason (kv_exhausted, class, slo, fair_share, stall, requeue).",
        "reason",
        ((reason.value, count) for reason, count in stats.preemptions),
    )
    if step_budget is not None and step_budget.step_target_s is not None:
        yield GaugeMetricFamily(
            "weir_scheduler_step_target_seconds",
            "Time target of the last engine step: the tightest ITL target running, else the throughput target.",
            value=step_budget.step_target_s,
        )
