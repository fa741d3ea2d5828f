"""`/metrics` of the shared KV store tier (engine/kv/store/tier.py), read at scrape time.

Only with a store (`--kv-store`):

- `weir_kv_store_blocks{result="hit"|"miss"}`: blocks asked of the store, found (verified) or not;
- `weir_kv_store_refused_blocks{reason="bad_mac"|"wrong_length"}`: values never loaded;
- `weir_kv_store_bytes_read`, `weir_kv_store_bytes_written`; `weir_kv_store_written_blocks{scope}`;
- `weir_kv_store_fetch_latency_seconds`: one pipelined chain read, a histogram;
- `weir_kv_store_errors{op="fetch"|"write"}`, `weir_kv_store_dropped_writes` (the scope's share of
  the write queue full, or the breaker open) and `weir_kv_store_dropped_writes_by_scope{scope}`,
  `weir_kv_store_evicted_entries` (a scope's cap evicting its own oldest),
  `weir_kv_store_flushed_entries`;
- `weir_kv_store_fetch_queue{outcome="refused"|"shed"|"cancelled"}`: fetches the fair fetch queue
  refused (full for the tenant), gave up for a tenant with a shorter backlog, or never ran because
  their request ended;
- `weir_kv_store_breaker_state`: 0 closed, 1 open, 2 half-open;
- `weir_kv_store_fetch_decisions{decision}`: requests whose lookup could continue into the store,
  each counted once per decision: fetched, or recomputed because that was cheaper, the breaker was
  open, the bytes held for fetches (all, or the tenant's share) were at their cap, or the fetch
  queue was full for the tenant;
  `weir_kv_store_fetch_timeouts`, `weir_kv_store_landed_blocks`, `weir_kv_store_requests_fetching`;
- `weir_kv_store_fetch_bandwidth_bytes_per_second` (measured) and
  `weir_kv_store_decision_recompute_tokens_per_second`: the figures the last fetch was decided on;
- `weir_kv_store_scope_bytes{scope}`: a scope's bytes in the store after this replica's last write
  to it, and `weir_kv_store_scope_max_bytes`, the cap each scope has.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from weir.engine.engine_stats import EngineStats
from weir.engine.kv.store.stats import FETCH_LATENCY_BUCKETS_S
from weir.gateway.metrics.scrape_families import labelled, unlabelled


def kv_store_metrics(stats: EngineStats) -> Iterator[Metric]:
    """The store tier's families of one engine snapshot (none without a store)."""
    store = stats.kv_store
    if store is None:
        return
    io, d = store.io, store.decisions
    yield from unlabelled(
        CounterMetricFamily,
        (
            ("weir_kv_store_bytes_read", "Bytes read from the shared KV store.", io.bytes_read),
            ("weir_kv_store_bytes_written", "Bytes written to the shared KV store.", io.bytes_written),
            (
                "weir_kv_store_dropped_writes",
                "KV blocks not written because the write queue was full or the breaker open.",
                io.num_dropped_writes,
            ),
            (
                "weir_kv_store_evicted_entries",
                "Store entries a scope's cap evicted (its oldest).",
                io.num_evicted,
            ),
            ("weir_kv_store_flushed_entries", "Store entries removed by flushes.", io.num_flushed),
            (
                "weir_kv_store_fetch_timeouts",
                "Fetches that outlasted their request's prefill time.",
                d.num_timeouts,
            ),
            ("weir_kv_store_landed_blocks", "Store blocks copied into device blocks.", d.num_landed_blocks),
        ),
    )
    for name, documentation, label, values in (
        ("weir_kv_store_blocks", "KV blocks asked of the shared store, by result.", "result",
         [("hit", io.num_hit_blocks), ("miss", io.num_miss_blocks)]),
        ("weir_kv_store_refused_blocks", "Store values never loaded (recomputed), by reason.", "reason",
         [("bad_mac", io.num_bad_mac), ("wrong_length", io.num_bad_length)]),
        ("weir_kv_store_errors", "Failed store calls, by operation.", "op",
         [("fetch", io.num_fetch_errors), ("write", io.num_write_errors)]),
        ("weir_kv_store_dropped_writes_by_scope",
         "KV blocks not written (the scope's share of the write queue full, or the breaker open), by cache scope.",
         "scope", sorted(io.dropped_writes_by_scope.items())),
        ("weir_kv_store_fetch_queue",
         "Fetches the fair fetch queue refused, shed for a tenant with a shorter backlog, or cancelled.",
         "outcome", [("refused", io.num_fetches_refused), ("shed", io.num_fetches_shed),
                     ("cancelled", io.num_fetches_cancelled)]),
        ("weir_kv_store_written_blocks", "KV blocks written to the store, by cache scope.", "scope",
         sorted(io.written_blocks_by_scope.items())),
        ("weir_kv_store_fetch_decisions",
         "Requests whose lookup could continue into the store, once per decision: fetched, or recomputed and why.",
         "decision", [("fetch", d.num_fetched), ("recompute_cheaper", d.num_recompute_cheaper),
                      ("breaker_open", d.num_breaker_open), ("over_bytes", d.num_over_bytes),
                      ("tenant_over_bytes", d.num_tenant_over_bytes), ("queue_full", d.num_queue_full)]),
    ):  # fmt: skip
        yield labelled(CounterMetricFamily, name, documentation, label, values)
    cumulative, buckets = 0, []
    for bound, count in zip(FETCH_LATENCY_BUCKETS_S, io.fetch_latency_buckets, strict=True):
        cumulative += count
        buckets.append((repr(bound), cumulative))
    buckets.append(("+Inf", io.num_fetches))
    yield HistogramMetricFamily(
        "weir_kv_store_fetch_latency_seconds",
        "Time of one pipelined read of a hash chain from the store.",
        buckets=buckets,
        sum_value=io.fetch_latency_sum_s,
    )
    yield from unlabelled(GaugeMetricFamily, (
        ("weir_kv_store_breaker_state", "The store's circuit breaker: 0 closed, 1 open, 2 half-open.",
         store.breaker_state.value),
        ("weir_kv_store_requests_fetching", "Requests waiting for their blocks from the store.", store.num_fetching),
        ("weir_kv_store_fetch_bandwidth_bytes_per_second", "Store read bandwidth (moving average).",
         io.bytes_per_s),
        ("weir_kv_store_decision_recompute_tokens_per_second",
         "The prefill rate the last fetch decision weighed the store's bandwidth against.",
         d.last_recompute_tokens_per_s),
        ("weir_kv_store_scope_max_bytes", "The store bytes each cache scope may hold.",
         store.max_entries_per_scope * store.value_bytes),
    ))  # fmt: skip
    yield labelled(
        GaugeMetricFamily,
        "weir_kv_store_scope_bytes",
        "A cache scope's bytes in the store after this replica's last write to it.",
        "scope",
        ((scope, entries * store.value_bytes) for scope, entries in sorted(io.scope_entries.items())),
    )
