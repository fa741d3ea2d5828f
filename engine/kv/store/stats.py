"""The shared KV store tier's numbers: the I/O threads' counters and the engine's fetch decisions.

Plain data (no torch, no redis), carried in `EngineStats.kv_store` to /metrics
(`weir.gateway.metrics.kv_store_metrics`) and the admin prefix-cache route.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Upper bounds (seconds) of the fetch latency histogram's buckets.
FETCH_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class BreakerState(enum.Enum):
    """A circuit breaker's state (`weir.engine.kv.store.circuit_breaker`)."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass
class StoreCounters:
    """The store's I/O since start-up (written by the I/O threads, copied for stats)."""

    num_fetches: int = 0
    num_hit_blocks: int = 0
    num_miss_blocks: int = 0
    num_bad_mac: int = 0
    num_bad_length: int = 0
    num_fetch_errors: int = 0
    num_fetches_refused: int = 0  # the fetch queue was full for the tenant (its request recomputes)
    num_fetches_shed: int = 0  # queued, then given up for a tenant with a shorter backlog
    num_fetches_cancelled: int = 0  # still queued when its request ended: never run
    bytes_read: int = 0
    num_written_blocks: int = 0
    bytes_written: int = 0
    num_dropped_writes: int = 0
    num_write_errors: int = 0
    num_evicted: int = 0  # entries a scope's cap evicted (its own oldest)
    num_flushed: int = 0  # entries removed by flushes
    fetch_latency_sum_s: float = 0.0
    fetch_latency_buckets: list[int] = field(default_factory=lambda: [0] * len(FETCH_LATENCY_BUCKETS_S))
    bytes_per_s: float = 0.0  # fetch bandwidth, moving average; 0: not measured yet
    scope_entries: dict[str, int] = field(default_factory=dict)  # index size after this replica's last write
    written_blocks_by_scope: dict[str, int] = field(default_factory=dict)
    dropped_writes_by_scope: dict[str, int] = field(default_factory=dict)


@dataclass
class FetchDecisions:
    """Requests whose lookup could continue into the store, by what was decided (monotonic).

    Each request counts once per decision, not once per step it was looked up in: a request
    refused for the same reason step after step counts once."""

    num_fetched: int = 0  # the read was estimated to beat recompute
    num_recompute_cheaper: int = 0
    num_breaker_open: int = 0
    num_over_bytes: int = 0  # the bytes held for every waiting request were at their cap
    num_tenant_over_bytes: int = 0  # the bytes held for its tenant's waiting requests were at its share
    num_queue_full: int = 0  # the fetch queue was full for its tenant
    num_timeouts: int = 0  # the fetch did not end within its request's prefill time
    num_landed_blocks: int = 0  # blocks copied into device blocks from the store
    # The figures that decided the last fetch: the store's bandwidth and the recompute rate.
    last_fetch_bytes_per_s: float = 0.0
    last_recompute_tokens_per_s: float = 0.0


@dataclass(frozen=True)
class KVStoreStats:
    """The store tier at one moment."""

    decisions: FetchDecisions
    io: StoreCounters
    num_fetching: int  # requests waiting for their blocks now
    breaker_state: BreakerState
    value_bytes: int  # one stored block (KV bytes and MAC)
    max_entries_per_scope: int
