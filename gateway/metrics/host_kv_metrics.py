"""`/metrics` of the host KV tier and of preemption by mode (engine/kv/host_kv_tier.py), read at scrape time.

Always, with or without a host tier:

- `weir_num_requests_swapped`: requests whose KV blocks are in the host tier now;
- `weir_preemptions_by_mode{mode="swap"|"recompute"}`: preempted sequences by how they gave back
  their blocks (a failed step's requeue counts as a recompute).

With a host tier (`--host-kv-cache-tokens`):

- `weir_kv_blocks_swapped_out`, `weir_kv_blocks_swapped_in`: blocks copied for swapped requests;
- `weir_prefix_cache_demotions`, `weir_prefix_cache_promotions`: cached blocks copied to the host
  on eviction from the device, and back to the device on a prefix hit;
- `weir_host_kv_cache_usage_ratio`, `weir_host_kv_cache_free_blocks`,
  `weir_host_kv_cache_total_blocks`, `weir_host_kv_cache_cached_blocks`: the host pool;
- `weir_host_kv_copy_bandwidth_bytes_per_second`: the copy bandwidth measured at start-up, which
  the swap-or-recompute cost model uses.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.engine_stats import EngineStats
from weir.gateway.metrics.scrape_families import labelled, unlabelled


def host_kv_metrics(stats: EngineStats) -> Iterator[Metric]:
    """The host-tier and preemption-mode families of one engine snapshot."""
    host = stats.host_kv
    num_swaps = host.num_swap_preemptions if host is not None else 0
    yield GaugeMetricFamily(
        "weir_num_requests_swapped",
        "Requests whose KV blocks are in the host tier now.",
        value=host.num_swapped_requests if host is not None else 0,
    )
    yield labelled(
        CounterMetricFamily,
        "weir_preemptions_by_mode",
        "Preempted sequences by how they gave back their KV blocks.",
        "mode",
        (("swap", num_swaps), ("recompute", max(0, stats.num_preemptions - num_swaps))),
    )
    if host is None:
        return
    yield from unlabelled(
        CounterMetricFamily,
        (
            (
                "weir_kv_blocks_swapped_out",
                "KV blocks copied to the host tier for swapped-out requests.",
                host.num_blocks_swapped_out,
            ),
            (
                "weir_kv_blocks_swapped_in",
                "KV blocks copied back to the device for swapped-in requests.",
                host.num_blocks_swapped_in,
            ),
            (
                "weir_prefix_cache_demotions",
                "Cached blocks copied to the host tier on eviction from the device.",
                host.num_demotions,
            ),
            (
                "weir_prefix_cache_promotions",
                "Host-tier blocks copied back to the device on a prefix-cache hit.",
                host.num_promotions,
            ),
        ),
    )
    yield from unlabelled(
        GaugeMetricFamily,
        (
            ("weir_host_kv_cache_usage_ratio", "Share of host-tier KV blocks in use (0-1).", host.usage),
            (
                "weir_host_kv_cache_free_blocks",
                "Free host-tier KV blocks (cached ones included).",
                host.num_free_blocks,
            ),
            ("weir_host_kv_cache_total_blocks", "KV blocks in the host tier.", host.num_total_blocks),
            (
                "weir_host_kv_cache_cached_blocks",
                "Host-tier blocks holding demoted or swapped prefix blocks.",
                host.num_cached_blocks,
            ),
            (
                "weir_host_kv_copy_bandwidth_bytes_per_second",
                "Device <-> host KV copy bandwidth measured at start-up.",
                host.copy_bytes_per_s,
            ),
        ),
    )
