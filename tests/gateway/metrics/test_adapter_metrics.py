"""Per-adapter Prometheus metrics from the engines' stats snapshots."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from weir.engine.engine_stats import EngineStats
from weir.engine.lora.lora_types import AdapterInfo
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.metrics.engine_collectors import AdapterMetricsCollector


def info(name: str, slot: int | None, requests: int, tokens: int, loads: int, evictions: int) -> AdapterInfo:
    return AdapterInfo(name, name, 8, ("q_proj",), "f" * 32, 1024, slot, requests, tokens, loads, evictions)


def stats(*adapters: AdapterInfo) -> EngineStats:
    return EngineStats(
        num_running=0, num_waiting=0, num_total_blocks=8, num_free_blocks=8, block_size=16, adapters=adapters
    )


def test_each_adapter_is_labelled_by_its_base_version() -> None:
    snapshots = {"m@v1": stats(info("a", 0, 3, 40, 2, 1), info("b", None, 1, 7, 1, 1)), "m@v2": stats()}
    registry = CollectorRegistry()
    registry.register(AdapterMetricsCollector(lambda: snapshots))
    text = generate_latest(registry).decode()
    assert 'weir_lora_adapter_requests_total{adapter="a",model_version="m@v1"} 3.0' in text
    assert 'weir_lora_adapter_tokens_total{adapter="b",model_version="m@v1"} 7.0' in text
    assert 'weir_lora_adapter_slot_loads_total{adapter="a",model_version="m@v1"} 2.0' in text
    assert 'weir_lora_adapter_slot_evictions_total{adapter="b",model_version="m@v1"} 1.0' in text
    assert 'weir_lora_adapter_in_slot{adapter="b",model_version="m@v1"} 0.0' in text


def test_a_failing_read_yields_nothing() -> None:
    def broken() -> dict[str, EngineStats]:
        raise RuntimeError("engine gone")

    registry = CollectorRegistry()
    registry.register(AdapterMetricsCollector(broken))
    assert "weir_lora" not in generate_latest(registry).decode()


def test_fleet_stats_keep_every_engines_adapters() -> None:

    fleet = ModelFleet()
    fleet.stats_by_version = lambda: {
        "m@v1": stats(info("a", 0, 1, 1, 1, 0)),
        "m@v2": stats(info("b", 0, 1, 1, 1, 0)),
    }  # type: ignore[method-assign]
    assert [a.name for a in fleet.stats().adapters] == ["a", "b"]
