"""gateway/metrics/server_load_metrics.py: the pod's load as unlabelled gauges, from the combined snapshot."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from weir.engine.engine_stats import EngineStats
from weir.gateway.metrics.engine_collectors import ServerLoadCollector


def _scrape(collector: ServerLoadCollector) -> dict[str, tuple[dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {s.name: (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_gauges_are_the_snapshot_of_the_whole_server() -> None:
    stats = EngineStats(
        num_running=3,
        num_waiting=2,
        num_total_blocks=200,
        num_free_blocks=150,
        block_size=16,
        num_waiting_tokens=70,
    )
    samples = _scrape(ServerLoadCollector(lambda: stats))
    assert samples == {
        "weir_server_requests_waiting": ({}, 2),
        "weir_server_requests_running": ({}, 3),
        "weir_server_waiting_tokens": ({}, 70),
        "weir_server_kv_cache_usage_ratio": ({}, 0.25),
        "weir_server_kv_cache_block_size": ({}, 16),
        "weir_server_kv_cache_total_blocks": ({}, 200),
    }


def test_a_broken_engine_leaves_the_gauges_out_instead_of_failing_the_scrape() -> None:
    def broken() -> EngineStats:
        raise RuntimeError("engine gone")

    assert _scrape(ServerLoadCollector(broken)) == {}
