"""The scrape-time collectors that read `EngineStats`, in one place.

Each engine refreshes an `EngineStats` snapshot every step (`AsyncEngine.stats()`); these
collectors read it when Prometheus scrapes, so the request path pays nothing for them. The metric
families themselves are computed by one function per concept (`host_kv_metrics`,
`spec_decode_metrics`, `step_budget_metrics`, `step_threads_metrics`, `slo_metrics`, `adapter_metrics`,
`server_load_metrics`); this module decides which snapshot each one reads and how the
families of several engines are labelled:

- `FleetStatsCollector`: the engine-load families of every loaded version, one sample per
  `model_version` label;
- `ServerLoadCollector`: the pod's total over every version, unlabelled, for routers and autoscalers;
- `AdapterMetricsCollector`: per LoRA adapter, labelled by version and adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.engine_stats import EngineStats
from weir.gateway.metrics.adapter_metrics import adapter_metrics
from weir.gateway.metrics.host_kv_metrics import host_kv_metrics
from weir.gateway.metrics.kv_store_metrics import kv_store_metrics
from weir.gateway.metrics.scrape_families import SnapshotCollector, labelled
from weir.gateway.metrics.server_load_metrics import server_load_metrics
from weir.gateway.metrics.slo_metrics import slo_metrics
from weir.gateway.metrics.spec_decode_metrics import spec_decode_metrics
from weir.gateway.metrics.step_budget_metrics import step_budget_metrics
from weir.gateway.metrics.step_threads_metrics import step_threads_metrics


def engine_load_metrics(s: EngineStats) -> Iterator[Metric]:
    """The engine-load families of one engine snapshot."""
    yield GaugeMetricFamily(
        "weir_num_requests_running", "Sequences in the running batch.", value=s.num_running
    )
    yield GaugeMetricFamily(
        "weir_num_requests_waiting", "Sequences in the waiting queue.", value=s.num_waiting
    )
    yield GaugeMetricFamily(
        "weir_num_waiting_tokens", "Prompt tokens waiting for prefill.", value=s.num_waiting_tokens
    )
    yield GaugeMetricFamily("weir_kv_cache_usage_ratio", "Share of KV blocks in use (0-1).", value=s.kv_usage)
    yield GaugeMetricFamily("weir_kv_cache_free_blocks", "Free KV blocks.", value=s.num_free_blocks)
    yield GaugeMetricFamily("weir_kv_cache_total_blocks", "KV blocks in the pool.", value=s.num_total_blocks)
    yield GaugeMetricFamily("weir_kv_cache_block_size", "Tokens per KV block.", value=s.block_size)
    yield GaugeMetricFamily(
        "weir_cpu_row_inputs",
        "Input rows up to which the CPU linears use their row copies (0: none).",
        value=s.cpu_row_inputs,
    )
    yield GaugeMetricFamily(
        "weir_prefix_cache_hit_rate",
        "Prefix-cache hits over queries (0-1).",
        value=s.prefix_cache_hit_rate,
    )
    yield CounterMetricFamily(
        "weir_num_preemptions", "Sequences preempted by the scheduler.", value=s.num_preemptions
    )
    yield CounterMetricFamily(
        "weir_engine_restarts",
        "Engine loop restarts after an exception it could not contain.",
        value=s.num_restarts,
    )
    yield CounterMetricFamily(
        "weir_engine_stalls",
        "Stalls: steps in a row that fed no token while work existed; each was logged and broken by a preemption.",
        value=s.num_stalls,
    )
    yield CounterMetricFamily(
        "weir_grammar_masks_late",
        "Constrained rows that sat a step out because their grammar mask, computed ahead on a worker, was not ready.",
        value=s.num_grammar_masks_late,
    )
    yield CounterMetricFamily(
        "weir_grammar_mask_timeouts",
        "Requests failed because their grammar mask stayed late past its time limit.",
        value=s.num_grammar_mask_timeouts,
    )
    yield CounterMetricFamily(
        "weir_grammar_mask_workers_added",
        "Grammar mask threads started beyond the pool's size so that a tenant with no mask running got a "
        "worker at once while other tenants' masks held them all.",
        value=s.num_grammar_mask_workers_added,
    )
    yield from _step_time_metrics(s)
    yield CounterMetricFamily(
        "weir_engine_native_decode_steps",
        "Decode steps whose layers ran in one C call (CPU float32, at most 16 rows, no LoRA); the"
        ' rest of weir_engine_steps{kind="decode"} ran layer by layer.',
        value=s.native_decode_steps,
    )
    yield CounterMetricFamily(
        "weir_prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache.",
        value=s.prefix_cache_queries,
    )
    yield CounterMetricFamily(
        "weir_prefix_cache_hits", "Prompt tokens found in the prefix cache.", value=s.prefix_cache_hits
    )
    yield from step_budget_metrics(s.step_budget)
    yield from slo_metrics(s.slo, s.step_budget)
    yield from host_kv_metrics(s)
    yield from kv_store_metrics(s)
    yield from spec_decode_metrics(s)
    yield from step_threads_metrics(s.step_threads)


def _step_time_metrics(s: EngineStats) -> Iterator[Metric]:
    """Model-runner steps and their seconds by kind (`weir.engine.output.StepTimeTotals`)."""
    kinds = "prefill (fed prompt tokens or drafts to verify) or decode (decode rows only)"
    t = s.step_times
    yield labelled(
        CounterMetricFamily,
        "weir_engine_steps",
        f"Model-runner steps: {kinds}.",
        "kind",
        (("decode", t.decode_steps), ("prefill", t.prefill_steps)),
    )
    yield labelled(
        CounterMetricFamily,
        "weir_engine_step_seconds",
        f"Seconds of model-runner steps: {kinds}. Every running stream waits for every step: the"
        " prefill share is what other prompts add to its ITL.",
        "kind",
        (("decode", t.decode_seconds), ("prefill", t.prefill_seconds)),
    )


def _by_model_version(snapshots: Mapping[str, EngineStats]) -> Iterator[Metric]:
    """`engine_load_metrics` of every snapshot, one family each, its samples labelled `model_version`."""
    merged: dict[str, Metric] = {}
    for version_id, snapshot in sorted(snapshots.items()):
        for family in engine_load_metrics(snapshot):
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(family.name, family.documentation, family.type)
            for sample in family.samples:
                out.add_sample(sample.name, {**sample.labels, "model_version": version_id}, sample.value)
    yield from merged.values()


class FleetStatsCollector(SnapshotCollector[Mapping[str, EngineStats]]):
    """The same engine-load metrics for several engines, one sample per `model_version` label."""

    def __init__(self, stats_by_version: Callable[[], Mapping[str, EngineStats]]) -> None:
        super().__init__(stats_by_version, _by_model_version)


class ServerLoadCollector(SnapshotCollector[EngineStats]):
    """Pod-level load gauges, read from the server's combined engine snapshot at scrape time."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        super().__init__(stats, server_load_metrics)


class AdapterMetricsCollector(SnapshotCollector[Mapping[str, EngineStats]]):
    """`adapter_metrics` over the fleet's `stats_by_version`."""

    def __init__(self, stats_by_version: Callable[[], Mapping[str, EngineStats]]) -> None:
        super().__init__(stats_by_version, adapter_metrics)
