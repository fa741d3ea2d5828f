"""`/metrics` of the CPU's intra-op threads per step (engine/runner/step_threads.py), read at scrape time.

- `weir_engine_step_threads`: the counts the engine switches between, labelled `steps="narrow"`
  (the process's count, for steps of few rows) and `steps="wide"` (the count it measures against
  it for wider ones);
- `weir_engine_wide_step_threads_chosen`: per bucket of rows measured on both counts (`min_rows`:
  its least rows, 4, 8, 16, ...), the count its wide steps run on now;
- `weir_engine_wide_steps`: steps run on the wide count (counter), explored ones included.

Absent on a GPU and where the switch is off (`--cpu-wide-step-threads 0`): one count for every step.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.engine_stats import StepThreadsStats
from weir.gateway.metrics.scrape_families import labelled


def step_threads_metrics(stats: StepThreadsStats | None) -> Iterator[Metric]:
    """The step-threads families of one engine snapshot (nothing without a switch)."""
    if stats is None:
        return
    yield labelled(
        GaugeMetricFamily,
        "weir_engine_step_threads",
        "Intra-op threads the CPU engine switches between: narrow steps' and wide steps' candidate.",
        "steps",
        (("narrow", stats.decode_threads), ("wide", stats.wide_threads)),
    )
    yield labelled(
        GaugeMetricFamily,
        "weir_engine_wide_step_threads_chosen",
        "Intra-op threads the wide steps of a bucket of rows run on, as measured faster.",
        "min_rows",
        ((str(min_rows), count) for min_rows, count in stats.choices),
    )
    yield CounterMetricFamily(
        "weir_engine_wide_steps",
        "Steps the CPU engine ran on its wide thread count.",
        value=stats.num_wide_steps,
    )
