"""Prometheus metrics of the prefix cache, per tenant and per scope, read at scrape time.

The numbers come from `PrefixCacheControl.snapshot()`, a copy the engine thread
refreshes about once a second, so a scrape never waits on the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.kv.prefix_cache_types import PrefixCacheStats
from weir.gateway.metrics.scrape_families import SnapshotCollector


class PrefixCacheCollector(SnapshotCollector[PrefixCacheStats]):
    """Hits and queries per tenant; cached blocks and evictions per cache scope."""

    def __init__(self, snapshot: Callable[[], PrefixCacheStats]) -> None:
        super().__init__(snapshot, prefix_cache_metrics)


def prefix_cache_metrics(s: PrefixCacheStats) -> Iterator[Metric]:
    """The prefix cache's families of one snapshot."""
    requests = CounterMetricFamily(
        "weir_prefix_cache_tenant_queries", "Requests looked up in the prefix cache.", labels=["tenant"]
    )
    queried = CounterMetricFamily(
        "weir_prefix_cache_tenant_queried_tokens",
        "Prompt tokens looked up in the prefix cache.",
        labels=["tenant"],
    )
    hits = CounterMetricFamily(
        "weir_prefix_cache_tenant_hit_tokens",
        "Prompt tokens found in the prefix cache.",
        labels=["tenant"],
    )
    for t in s.tenants:
        requests.add_metric([t.tenant_id], t.num_queries)
        queried.add_metric([t.tenant_id], t.num_queried_tokens)
        hits.add_metric([t.tenant_id], t.num_hit_tokens)
    cached = GaugeMetricFamily(
        "weir_prefix_cache_cached_blocks", "KV blocks cached per cache scope.", labels=["scope"]
    )
    evictions = CounterMetricFamily(
        "weir_prefix_cache_evictions", "Cached KV blocks evicted per cache scope.", labels=["scope"]
    )
    for c in s.scopes:
        cached.add_metric([c.cache_scope], c.num_cached_blocks)
        evictions.add_metric([c.cache_scope], c.num_evictions)
    yield from (requests, queried, hits, cached, evictions)
    yield GaugeMetricFamily(
        "weir_prefix_cache_pinned_blocks",
        "KV blocks held by pinned shared prefixes.",
        value=s.num_pinned_blocks,
    )
