"""Prometheus metrics of one app, in its own CollectorRegistry (never the global one).

Latency histograms and token counters are fed by accounting when a request ends; engine load
gauges (running, waiting, KV usage, prefix-cache hit rate, preemptions) are read from
`EngineClient.stats()` at scrape time, so the request path pays nothing for them.

The registry is built first and handed to everything that adds to it: the per-concept metrics
(`weir.gateway.metrics.admission_metrics.AdmissionMetrics(registry)`) and the scrape-time collectors
(`weir.gateway.metrics.prefix_cache_metrics`, `weir.gateway.metrics.usage_metrics`, passed as `collectors`), so the app, the
admission controller and the metrics listener all receive a registry that is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from weir.engine.engine_stats import EngineStats
from weir.gateway.metrics.engine_collectors import engine_load_metrics
from weir.gateway.metrics.scrape_families import SnapshotCollector

# Seconds. Wide enough for a 135M model on two CPU cores and for a GPU.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_LABELS = ("model", "tenant")


@dataclass(frozen=True)
class _RequestSeries:
    """The per-request series of one (model, tenant): looked up once, not eight times a request
    (`labels()` validates, joins and locks on each call)."""

    ttft: Histogram
    tpot: Histogram
    itl: Histogram
    e2e: Histogram
    queue: Histogram
    prompt_tokens: Counter
    cached_prompt_tokens: Counter
    generation_tokens: Counter


class GatewayMetrics:
    """The metrics of one gateway app. `model` and `tenant` label everything per request."""

    def __init__(
        self,
        stats: Callable[[], EngineStats] | None,
        registry: CollectorRegistry | None = None,
        collectors: Sequence[Collector] = (),
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "weir_time_to_first_token_seconds",
            "Arrival to first token.",
            _LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "weir_time_per_output_token_seconds",
            "Mean time per output token after the first.",
            _LABELS,
            buckets=_TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "weir_inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            _LABELS,
            buckets=_TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "weir_e2e_request_latency_seconds",
            "Arrival to last token.",
            _LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "weir_request_queue_time_seconds",
            "Arrival to first scheduled.",
            _LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "weir_prompt_tokens", "Prompt tokens of finished requests.", _LABELS, registry=r
        )
        self.cached_prompt_tokens = Counter(
            "weir_cached_prompt_tokens", "Prompt tokens served from the prefix cache.", _LABELS, registry=r
        )
        self.generation_tokens = Counter("weir_generation_tokens", "Generated tokens.", _LABELS, registry=r)
        self.finished = Counter(
            "weir_requests_finished", "Finished choices by finish reason.", (*_LABELS, "reason"), registry=r
        )
        self.errors = Counter(
            "weir_request_errors", "Requests answered with an error, by HTTP status.", ("status",), registry=r
        )
        self._series: dict[tuple[str, str], _RequestSeries] = {}  # as many as the labels' series
        if stats is not None:  # None: the engines' load comes from a FleetStatsCollector in `collectors`
            r.register(SnapshotCollector(stats, engine_load_metrics))
        for collector in collectors:
            r.register(collector)

    def observe_latency(
        self,
        model: str,
        tenant: str,
        *,
        ttft_s: float | None,
        tpot_s: float | None,
        e2e_s: float | None,
        queue_s: float | None,
        itl_s: Sequence[float] = (),
    ) -> None:
        """Record one request's latencies; None means not measured."""
        series = self._of(model, tenant)
        if ttft_s is not None:
            series.ttft.observe(ttft_s)
        if tpot_s is not None:
            series.tpot.observe(tpot_s)
        if e2e_s is not None:
            series.e2e.observe(e2e_s)
        if queue_s is not None:
            series.queue.observe(queue_s)
        for gap in itl_s:
            series.itl.observe(gap)

    def count_tokens(self, model: str, tenant: str, *, prompt: int, cached: int, generated: int) -> None:
        """Add one request's token counts."""
        series = self._of(model, tenant)
        if prompt:
            series.prompt_tokens.inc(prompt)
        if cached:
            series.cached_prompt_tokens.inc(cached)
        if generated:
            series.generation_tokens.inc(generated)

    def _of(self, model: str, tenant: str) -> _RequestSeries:
        series = self._series.get((model, tenant))
        if series is None:
            series = self._series[(model, tenant)] = _RequestSeries(
                ttft=self.ttft.labels(model, tenant),
                tpot=self.tpot.labels(model, tenant),
                itl=self.itl.labels(model, tenant),
                e2e=self.e2e.labels(model, tenant),
                queue=self.queue.labels(model, tenant),
                prompt_tokens=self.prompt_tokens.labels(model, tenant),
                cached_prompt_tokens=self.cached_prompt_tokens.labels(model, tenant),
                generation_tokens=self.generation_tokens.labels(model, tenant),
            )
        return series

    def count_finished(self, model: str, tenant: str, reason: str) -> None:
        """One choice finished for `reason` (stop, length, abort, error, ...)."""
        self.finished.labels(model, tenant, reason).inc()

    def count_error(self, status_code: int) -> None:
        """One request answered with an HTTP error."""
        self.errors.labels(str(status_code)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
