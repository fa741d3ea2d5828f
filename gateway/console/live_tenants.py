"""The live page's per-tenant rows: throughput and TTFT/ITL percentiles from the gateway's metrics.

Read from the same Prometheus histograms and counters `/metrics` exports (labelled by model name
and tenant; they do not carry the version), so the console adds no second bookkeeping. Percentiles
are estimated from the histogram buckets as PromQL's `histogram_quantile` does (linear within a
bucket), since the server started. Throughput is generated tokens per second between two reads
(the page polls every few seconds), kept per (model, tenant). SLO attainment is per tenant, from
admission's `weir_slo_requests` counter (present when admission is on).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from weir.gateway.metrics.registry import GatewayMetrics

Key = tuple[str, str]  # (model, tenant)
SLO_METRIC = "weir_slo_requests_total"  # weir.gateway.metrics.admission_metrics: completed requests by result
MIN_RATE_INTERVAL_S = 1.0  # reads closer together keep the previous rate


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of a histogram given as (upper bound, cumulative count), bounds ascending.

    None without observations. In the +Inf bucket the answer is the largest finite bound.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _buckets(histogram: Histogram) -> dict[Key, list[tuple[float, float]]]:
    by_key: dict[Key, list[tuple[float, float]]] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                key = (sample.labels["model"], sample.labels["tenant"])
                by_key.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
    for rows in by_key.values():
        rows.sort()
    return by_key


def _totals(counter: Counter, suffix: str = "_total") -> dict[Key, float]:
    totals: dict[Key, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                key = (sample.labels["model"], sample.labels["tenant"])
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def slo_attainment(registry: CollectorRegistry) -> dict[str, float]:
    """Per tenant, the share of its completed requests that met its TTFT/TPOT objectives.

    Only tenants with an objective and admission on are counted (the counter exists only then).
    """
    met: dict[str, float] = {}
    total: dict[str, float] = {}
    for family in registry.restricted_registry([SLO_METRIC]).collect():
        for sample in family.samples:
            if sample.name != SLO_METRIC:
                continue
            tenant = sample.labels["tenant"]
            total[tenant] = total.get(tenant, 0.0) + sample.value
            if sample.labels["result"] == "met":
                met[tenant] = met.get(tenant, 0.0) + sample.value
    return {t: met.get(t, 0.0) / n for t, n in total.items() if n > 0}


@dataclass(frozen=True)
class TenantLive:
    """One (model, tenant) row of the live page."""

    model: str
    tenant: str
    requests: int  # finished choices since start
    generated_tokens: int
    tokens_per_s: float | None  # None until two reads
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    slo_met: float | None = None  # the tenant's share of requests within its objectives (all models)

    def cells(self) -> dict[str, str]:
        """The row as the page shows it (text only)."""

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{1000 * value:.0f} ms"

        return {
            "model": self.model,
            "tenant": self.tenant,
            "requests": str(self.requests),
            "generated_tokens": str(self.generated_tokens),
            "tokens_per_s": "-" if self.tokens_per_s is None else f"{self.tokens_per_s:.1f}",
            "ttft_p50": ms(self.ttft_p50_s),
            "ttft_p95": ms(self.ttft_p95_s),
            "itl_p50": ms(self.itl_p50_s),
            "itl_p95": ms(self.itl_p95_s),
            "slo_met": "-" if self.slo_met is None else f"{100 * self.slo_met:.1f}%",
        }


class LiveTenants:
    """Per-tenant rows from a `GatewayMetrics`, with the rate state between reads. Thread-safe."""

    def __init__(self, metrics: GatewayMetrics, timer: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._timer = timer
        self._lock = threading.Lock()
        self._last: tuple[float, dict[Key, float]] | None = None
        self._rates: dict[Key, float] = {}

    def _rates_now(self, generated: dict[Key, float]) -> dict[Key, float]:
        now = self._timer()
        with self._lock:
            if self._last is None:
                self._last = (now, generated)
            elif now - self._last[0] >= MIN_RATE_INTERVAL_S:
                then, before = self._last
                self._rates = {k: (v - before.get(k, 0.0)) / (now - then) for k, v in generated.items()}
                self._last = (now, generated)
            return dict(self._rates)

    def rows(self) -> list[TenantLive]:
        m = self._metrics
        generated = _totals(m.generation_tokens)
        finished = _totals(m.finished)
        ttft, itl = _buckets(m.ttft), _buckets(m.itl)
        rates = self._rates_now(generated)
        slo = slo_attainment(m.registry)
        keys: Iterable[Key] = sorted(set(generated) | set(finished) | set(ttft))
        return [
            TenantLive(
                model=k[0],
                tenant=k[1],
                requests=int(finished.get(k, 0)),
                generated_tokens=int(generated.get(k, 0)),
                tokens_per_s=rates.get(k),
                ttft_p50_s=histogram_quantile(0.5, ttft.get(k, [])),
                ttft_p95_s=histogram_quantile(0.95, ttft.get(k, [])),
                itl_p50_s=histogram_quantile(0.5, itl.get(k, [])),
                itl_p95_s=histogram_quantile(0.95, itl.get(k, [])),
                slo_met=slo.get(k[1]),
            )
            for k in keys
        ]
