"""Per-tenant admission metrics, registered on the app's own registry (`GatewayMetrics.registry`).

Admitted and rejected requests (by reason), reserved and refunded tokens, the predicted TTFT,
and goodput: finished requests that met their tenant's SLOs. Queue time and tokens served per
tenant are already measured by `weir.gateway.metrics.registry` (`weir_request_queue_time_seconds`,
`weir_prompt_tokens`, `weir_generation_tokens`), so they are not repeated here.
"""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)


class RejectReason(enum.Enum):
    """Why admission (or the queue, later) turned a request away; the metric label."""

    TOKENS_PER_MINUTE = "tokens_per_minute"
    TOKENS_PER_DAY = "tokens_per_day"
    MAX_CONCURRENT = "max_concurrent"
    REQUESTS_PER_MINUTE = "requests_per_minute"
    REQUEST_TOO_LARGE = "request_too_large"
    QUEUE_FULL = "queue_full"
    SLO_UNATTAINABLE = "slo_unattainable"
    DEADLINE_EXCEEDED = "deadline_exceeded"  # admitted, then aborted in the queue
    BUDGET_UNAVAILABLE = "budget_unavailable"  # the shared budget's database failed
    WINDOW_BUDGET = (
        "window_budget"  # a hard limit of a budget over a window (weir.tenancy.budgets.window_budgets)
    )


class SLOResult(enum.Enum):
    """Whether a finished request met its tenant's TTFT and TPOT objectives."""

    MET = "met"
    MISSED = "missed"


class AdmissionMetrics:
    """Counters and histograms of admission decisions, labelled by tenant."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.admitted = Counter(
            "weir_admission_admitted", "Requests admitted.", ("tenant", "priority"), registry=registry
        )
        self.rejected = Counter(
            "weir_admission_rejected",
            "Requests rejected by admission or aborted in the queue, by reason.",
            ("tenant", "reason"),
            registry=registry,
        )
        self.reserved_tokens = Counter(
            "weir_admission_reserved_tokens",
            "Tokens reserved at admission (prompt + max_tokens).",
            ("tenant",),
            registry=registry,
        )
        self.refunded_tokens = Counter(
            "weir_admission_refunded_tokens",
            "Reserved tokens given back at settlement (not used).",
            ("tenant",),
            registry=registry,
        )
        self.predicted_ttft = Histogram(
            "weir_admission_predicted_ttft_seconds",
            "TTFT predicted at admission from the engine's load.",
            ("tenant",),
            buckets=_SECONDS,
            registry=registry,
        )
        self.ttft_calibration = Gauge(
            "weir_admission_ttft_calibration",
            "Factor the TTFT predictions are multiplied by, learned from the TTFTs admitted requests "
            "got (1: unbiased or not enough reports yet).",
            ("priority",),
            registry=registry,
        )
        self.slo = Counter(
            "weir_slo_requests",
            "Completed requests by whether they met the tenant's TTFT and TPOT objectives "
            "(goodput: result=met).",
            ("tenant", "result"),
            registry=registry,
        )

    def count_admitted(self, tenant: str, priority: str) -> None:
        self.admitted.labels(tenant, priority).inc()

    def count_rejected(self, tenant: str, reason: RejectReason) -> None:
        self.rejected.labels(tenant, reason.value).inc()

    def count_tokens(self, tenant: str, *, reserved: int = 0, refunded: int = 0) -> None:
        if reserved:
            self.reserved_tokens.labels(tenant).inc(reserved)
        if refunded:
            self.refunded_tokens.labels(tenant).inc(refunded)

    def observe_prediction(self, tenant: str, seconds: float) -> None:
        self.predicted_ttft.labels(tenant).observe(seconds)

    def set_ttft_calibration(self, priority: str, factor: float) -> None:
        self.ttft_calibration.labels(priority).set(factor)

    def count_slo(self, tenant: str, result: SLOResult) -> None:
        self.slo.labels(tenant, result.value).inc()
