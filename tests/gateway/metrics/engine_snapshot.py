"""An engine snapshot for the /metrics tests: a small pool, one running sequence, and the fields a
test is about; and its scrape, sample by sample."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from weir.engine.engine_stats import EngineStats
from weir.gateway.metrics.registry import GatewayMetrics


def engine_stats(**fields: Any) -> EngineStats:
    """An `EngineStats` of one running sequence in a 10-block pool (5 free), with `fields` set."""
    base: dict[str, Any] = {
        "num_running": 1,
        "num_waiting": 0,
        "num_total_blocks": 10,
        "num_free_blocks": 5,
        "block_size": 16,
    }
    return EngineStats(**{**base, **fields})


def scrape(stats: EngineStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics of a gateway serving `stats`: each sample's value by its name and labels (sorted,
    without `model_version`)."""
    text = GatewayMetrics(lambda: stats).render()[0].decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_version"))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
