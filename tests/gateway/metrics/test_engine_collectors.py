"""gateway/metrics/engine_collectors.py: which snapshot each collector reads and how it labels it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from weir.engine.engine_stats import EngineStats, StepTimeTotals
from weir.gateway.metrics.engine_collectors import FleetStatsCollector, engine_load_metrics
from weir.gateway.metrics.scrape_families import SnapshotCollector


def _stats(**fields: int) -> EngineStats:
    return EngineStats(
        **{
            "num_running": 0,
            "num_waiting": 0,
            "num_total_blocks": 100,
            "num_free_blocks": 50,
            "block_size": 16,
            **fields,
        }
    )


def _samples(collector: Collector) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _per_version(snapshots: dict[str, EngineStats], family: str) -> dict[str, float]:
    """One sample family's value per model version, as the fleet collector exports it."""
    return {
        labels["model_version"]: value
        for name, labels, value in _samples(FleetStatsCollector(lambda: snapshots))
        if name == family
    }


def test_each_version_gets_its_own_sample_labelled_by_model_version() -> None:
    snapshots = {"m@v1": _stats(num_running=3, num_waiting=1), "m@v2": _stats(num_running=5)}
    assert _per_version(snapshots, "weir_num_requests_running") == {"m@v1": 3, "m@v2": 5}


def test_every_family_of_one_snapshot_is_labelled_once_per_version() -> None:
    one = _samples(SnapshotCollector(_stats, engine_load_metrics))
    assert one
    fleet = _samples(FleetStatsCollector(lambda: {"a@1": _stats(), "b@1": _stats()}))
    assert len(fleet) == 2 * len(one)
    assert {labels["model_version"] for _, labels, _ in fleet} == {"a@1", "b@1"}


def test_a_read_that_raises_yields_nothing_instead_of_failing_the_scrape() -> None:
    def broken() -> dict[str, EngineStats]:
        raise RuntimeError("engine gone")

    assert _samples(FleetStatsCollector(broken)) == []


def test_the_cpu_row_input_choice_is_a_gauge_per_version() -> None:
    snapshots = {"m@v1": _stats(cpu_row_inputs=2), "m@v2": _stats()}
    assert _per_version(snapshots, "weir_cpu_row_inputs") == {"m@v1": 2, "m@v2": 0}


def test_the_decode_steps_in_one_c_call_are_a_counter_per_version() -> None:
    snapshots = {"m@v1": _stats(native_decode_steps=12), "m@v2": _stats()}
    assert _per_version(snapshots, "weir_engine_native_decode_steps_total") == {"m@v1": 12, "m@v2": 0}


def test_step_counts_and_seconds_are_counters_by_kind_and_version() -> None:
    times = StepTimeTotals(decode_steps=300, decode_seconds=10.5, prefill_steps=40, prefill_seconds=6.25)
    snapshots = {"m@v1": EngineStats(0, 0, 100, 50, 16, step_times=times), "m@v2": _stats()}
    got = {
        (name, labels["model_version"], labels["kind"]): value
        for name, labels, value in _samples(FleetStatsCollector(lambda: snapshots))
        if name in ("weir_engine_steps_total", "weir_engine_step_seconds_total")
    }
    assert got == {
        ("weir_engine_steps_total", "m@v1", "decode"): 300,
        ("weir_engine_steps_total", "m@v1", "prefill"): 40,
        ("weir_engine_step_seconds_total", "m@v1", "decode"): 10.5,
        ("weir_engine_step_seconds_total", "m@v1", "prefill"): 6.25,
        ("weir_engine_steps_total", "m@v2", "decode"): 0,
        ("weir_engine_steps_total", "m@v2", "prefill"): 0,
        ("weir_engine_step_seconds_total", "m@v2", "decode"): 0,
        ("weir_engine_step_seconds_total", "m@v2", "prefill"): 0,
    }
