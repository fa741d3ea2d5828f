"""The engine's SLO accounting on /metrics: goodput per class and tenant, preemptions by reason,
the last step's target; from an engine snapshot."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.metrics.engine_snapshot import engine_stats
from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority
from weir.engine.scheduling.slo_tally import PreemptReason, SloCount, SloStats
from weir.engine.scheduling.step_budget import StepBudgetStats
from weir.gateway.metrics.registry import GatewayMetrics


def _scrape(stats: EngineStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = GatewayMetrics(lambda: stats).render()[0].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _stats(slo: SloStats, step_budget: StepBudgetStats | None = None) -> EngineStats:
    return engine_stats(slo=slo, step_budget=step_budget)


def test_goodput_per_class_and_tenant_and_preemptions_by_reason() -> None:
    slo = SloStats(
        counts=(SloCount(Priority.INTERACTIVE, "quiet", ttft_met=5, ttft_missed=1, itl_met=6),),
        preemptions=((PreemptReason.SLO, 3), (PreemptReason.KV, 2)),
    )
    got = _scrape(_stats(slo, StepBudgetStats(40, 0.8, None, step_target_s=0.3)))
    key = (("priority", "interactive"), ("result", "met"), ("target", "ttft"), ("tenant", "quiet"))
    assert got[("weir_engine_slo_sequences_total", key)] == 5
    missed = (("priority", "interactive"), ("result", "missed"), ("target", "ttft"), ("tenant", "quiet"))
    assert got[("weir_engine_slo_sequences_total", missed)] == 1
    itl = (("priority", "interactive"), ("result", "met"), ("target", "itl"), ("tenant", "quiet"))
    assert got[("weir_engine_slo_sequences_total", itl)] == 6
    assert got[("weir_engine_preemptions_by_reason_total", (("reason", "slo"),))] == 3
    assert got[("weir_engine_preemptions_by_reason_total", (("reason", "kv_exhausted"),))] == 2
    assert got[("weir_scheduler_step_target_seconds", ())] == 0.3


def test_nothing_judged_yet_and_no_step_target() -> None:
    got = _scrape(_stats(SloStats()))
    assert not any(name == "weir_engine_slo_sequences_total" for name, _ in got)
    assert ("weir_scheduler_step_target_seconds", ()) not in got
