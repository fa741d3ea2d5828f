"""The whole server's load as one series per pod, for routers and autoscalers.

The engine gauges of `weir.gateway.metrics.registry` carry a `model_version` label, one series per loaded model
version. A router that reads a model server's load from /metrics, like the Gateway API Inference
Extension's endpoint picker (its model-server protocol: queued requests, running requests,
KV-cache utilization as a fraction, block size, block count), or a HorizontalPodAutoscaler on
queue depth through the Prometheus adapter, wants the pod's total instead: these gauges are the
same quantities over every loaded version together (`ModelFleet.stats`), unlabelled, read at
scrape time. With one version they equal its own gauges.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from weir.engine.engine_stats import EngineStats

# The names the Helm chart's endpoint-picker config and autoscaler read (docs/kubernetes.md).
SERVER_REQUESTS_WAITING = "weir_server_requests_waiting"
SERVER_REQUESTS_RUNNING = "weir_server_requests_running"
SERVER_WAITING_TOKENS = "weir_server_waiting_tokens"
SERVER_KV_CACHE_USAGE_RATIO = "weir_server_kv_cache_usage_ratio"
SERVER_KV_CACHE_BLOCK_SIZE = "weir_server_kv_cache_block_size"
SERVER_KV_CACHE_TOTAL_BLOCKS = "weir_server_kv_cache_total_blocks"


def server_load_metrics(s: EngineStats) -> Iterator[Metric]:
    """The pod-level load gauges of the server's combined engine snapshot."""
    yield GaugeMetricFamily(
        SERVER_REQUESTS_WAITING, "Sequences waiting, all model versions together.", value=s.num_waiting
    )
    yield GaugeMetricFamily(
        SERVER_REQUESTS_RUNNING, "Sequences running, all model versions together.", value=s.num_running
    )
    yield GaugeMetricFamily(
        SERVER_WAITING_TOKENS,
        "Tokens the waiting sequences still need computed, all model versions together.",
        value=s.num_waiting_tokens,
    )
    yield GaugeMetricFamily(
        SERVER_KV_CACHE_USAGE_RATIO,
        "Share of the server's KV blocks in use (0-1), all model versions together.",
        value=s.kv_usage,
    )
    yield GaugeMetricFamily(
        SERVER_KV_CACHE_BLOCK_SIZE,
        "Tokens per KV block (of the first loaded version).",
        value=s.block_size,
    )
    yield GaugeMetricFamily(
        SERVER_KV_CACHE_TOTAL_BLOCKS,
        "KV blocks of the server, all model versions together.",
        value=s.num_total_blocks,
    )
