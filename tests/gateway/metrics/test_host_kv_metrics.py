"""The host KV tier and preemption-by-mode metrics on /metrics, from engine snapshots."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.metrics.engine_snapshot import engine_stats
from weir.engine.engine_stats import EngineStats
from weir.engine.kv.host_kv_tier import HostKVStats
from weir.gateway.metrics.engine_collectors import FleetStatsCollector
from weir.gateway.metrics.registry import GatewayMetrics


def _scrape(stats: EngineStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = GatewayMetrics(lambda: stats).render()[0].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _stats(host: HostKVStats | None, preemptions: int) -> EngineStats:
    return engine_stats(num_waiting=2, num_preemptions=preemptions, host_kv=host)


HOST = HostKVStats(
    num_total_blocks=100,
    num_free_blocks=75,
    num_cached_blocks=30,
    num_swapped_requests=2,
    num_blocks_swapped_out=40,
    num_blocks_swapped_in=31,
    num_swap_preemptions=5,
    num_demotions=12,
    num_promotions=7,
    copy_bytes_per_s=2.5e9,
)


def test_the_host_tier_counters_and_gauges() -> None:
    got = _scrape(_stats(HOST, preemptions=8))
    assert got[("weir_num_requests_swapped", ())] == 2
    assert got[("weir_preemptions_by_mode_total", (("mode", "swap"),))] == 5
    assert got[("weir_preemptions_by_mode_total", (("mode", "recompute"),))] == 3
    assert got[("weir_kv_blocks_swapped_out_total", ())] == 40
    assert got[("weir_kv_blocks_swapped_in_total", ())] == 31
    assert got[("weir_prefix_cache_demotions_total", ())] == 12
    assert got[("weir_prefix_cache_promotions_total", ())] == 7
    assert got[("weir_host_kv_cache_usage_ratio", ())] == 0.25
    assert got[("weir_host_kv_cache_free_blocks", ())] == 75
    assert got[("weir_host_kv_cache_total_blocks", ())] == 100
    assert got[("weir_host_kv_cache_cached_blocks", ())] == 30
    assert got[("weir_host_kv_copy_bandwidth_bytes_per_second", ())] == 2.5e9


def test_without_a_host_tier_every_preemption_recomputes_and_nothing_is_swapped() -> None:
    got = _scrape(_stats(None, preemptions=4))
    assert got[("weir_num_requests_swapped", ())] == 0
    assert got[("weir_preemptions_by_mode_total", (("mode", "recompute"),))] == 4
    assert got[("weir_preemptions_by_mode_total", (("mode", "swap"),))] == 0
    assert not any(name.startswith("weir_host_kv") for name, _ in got)


def test_each_model_version_has_its_own_samples() -> None:
    collector = FleetStatsCollector(lambda: {"v1": _stats(HOST, 8), "v2": _stats(None, 1)})
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }
    assert samples[("weir_preemptions_by_mode_total", (("mode", "swap"), ("model_version", "v1")))] == 5
    assert samples[("weir_preemptions_by_mode_total", (("mode", "recompute"), ("model_version", "v2")))] == 1
    assert samples[("weir_num_requests_swapped", (("model_version", "v1"),))] == 2
