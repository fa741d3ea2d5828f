"""Per-adapter Prometheus metrics, read at scrape time from each engine's stats snapshot.

Labels: `model_version` (the base version whose engine holds the adapter) and `adapter`. The
counters are the engine's own (`weir.engine.lora.lora_types.AdapterInfo`): they restart at 0 when an
adapter is loaded again, which Prometheus' `rate` treats as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.engine_stats import EngineStats

_LABELS = ["model_version", "adapter"]


def adapter_metrics(snapshots: Mapping[str, EngineStats]) -> Iterator[Metric]:
    """The adapter families over every engine's snapshot, by version id."""
    requests = CounterMetricFamily(
        "weir_lora_adapter_requests", "Requests run through the LoRA adapter.", labels=_LABELS
    )
    tokens = CounterMetricFamily(
        "weir_lora_adapter_tokens",
        "Tokens computed through the LoRA adapter (prompt and generated).",
        labels=_LABELS,
    )
    loads = CounterMetricFamily(
        "weir_lora_adapter_slot_loads", "Copies of the adapter into a device slot.", labels=_LABELS
    )
    evictions = CounterMetricFamily(
        "weir_lora_adapter_slot_evictions", "Evictions of the adapter from its device slot.", labels=_LABELS
    )
    in_slot = GaugeMetricFamily(
        "weir_lora_adapter_in_slot", "1 while the adapter holds a device slot, else 0.", labels=_LABELS
    )
    for version_id, snapshot in sorted(snapshots.items()):
        for info in snapshot.adapters:
            labels = [version_id, info.name]
            requests.add_metric(labels, info.num_requests)
            tokens.add_metric(labels, info.num_tokens)
            loads.add_metric(labels, info.num_slot_loads)
            evictions.add_metric(labels, info.num_slot_evictions)
            in_slot.add_metric(labels, 0 if info.slot is None else 1)
    yield from (requests, tokens, loads, evictions, in_slot)
