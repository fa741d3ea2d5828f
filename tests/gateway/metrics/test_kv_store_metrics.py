"""The shared KV store's families on /metrics, from an engine snapshot: the labelled counters, the
plain counters and gauges, the scopes' bytes, the latency histogram; none without a store."""

from __future__ import annotations

from tests.gateway.metrics.engine_snapshot import engine_stats, scrape
from weir.engine.kv.store.stats import BreakerState, FetchDecisions, KVStoreStats, StoreCounters


def _store() -> KVStoreStats:
    io = StoreCounters(
        num_fetches=2,
        num_hit_blocks=5,
        num_miss_blocks=1,
        num_fetches_shed=3,
        bytes_read=4096,
        scope_entries={"acme": 4},
        written_blocks_by_scope={"acme": 9},
    )
    decisions = FetchDecisions(num_fetched=2, num_queue_full=1, num_landed_blocks=5)
    return KVStoreStats(decisions, io, 1, BreakerState.OPEN, value_bytes=100, max_entries_per_scope=10)


def test_the_store_families_are_exported() -> None:
    got = scrape(engine_stats(kv_store=_store()))
    assert got[("weir_kv_store_blocks_total", (("result", "hit"),))] == 5
    assert got[("weir_kv_store_blocks_total", (("result", "miss"),))] == 1
    assert got[("weir_kv_store_fetch_queue_total", (("outcome", "shed"),))] == 3
    assert got[("weir_kv_store_written_blocks_total", (("scope", "acme"),))] == 9
    assert got[("weir_kv_store_fetch_decisions_total", (("decision", "queue_full"),))] == 1
    assert got[("weir_kv_store_bytes_read_total", ())] == 4096
    assert got[("weir_kv_store_landed_blocks_total", ())] == 5
    assert got[("weir_kv_store_breaker_state", ())] == BreakerState.OPEN.value
    assert got[("weir_kv_store_scope_max_bytes", ())] == 1000
    assert got[("weir_kv_store_scope_bytes", (("scope", "acme"),))] == 400
    assert got[("weir_kv_store_fetch_latency_seconds_count", ())] == 2


def test_no_store_no_families() -> None:
    assert not any(name.startswith("weir_kv_store") for name, _ in scrape(engine_stats()))
