"""The step-threads families on /metrics, from an engine snapshot: the two counts, each measured
bucket's choice, the wide steps; none where the engine does not switch."""

from __future__ import annotations

from tests.gateway.metrics.engine_snapshot import engine_stats, scrape
from weir.engine.engine_stats import EngineStats, StepThreadsStats


def _stats(step_threads: StepThreadsStats | None) -> EngineStats:
    return engine_stats(step_threads=step_threads)


def test_the_counts_the_choices_and_the_wide_steps_are_exported() -> None:
    got = scrape(_stats(StepThreadsStats(1, 2, num_wide_steps=41, choices=((4, 2), (8, 1)))))
    assert got[("weir_engine_step_threads", (("steps", "narrow"),))] == 1
    assert got[("weir_engine_step_threads", (("steps", "wide"),))] == 2
    assert got[("weir_engine_wide_step_threads_chosen", (("min_rows", "4"),))] == 2
    assert got[("weir_engine_wide_step_threads_chosen", (("min_rows", "8"),))] == 1
    assert got[("weir_engine_wide_steps_total", ())] == 41


def test_an_engine_without_the_switch_exports_none() -> None:
    assert not any(
        name.startswith("weir_engine_wide") or name == "weir_engine_step_threads"
        for name, _ in scrape(_stats(None))
    )
