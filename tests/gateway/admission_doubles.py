"""Builders for the admission tests: tenants, engine requests, usage records, engine snapshots, and
an admission controller over a frozen clock (`make_setup`), shared by test_admission*.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tests.gateway.harness import MODEL
from weir.engine.client import EngineRequest
from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority, SamplingParams
from weir.gateway.admission.accounting import Admitted, Outcome, Usage, UsageRecord
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController
from weir.gateway.api.protocol import Endpoint
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext

START = 1_900_000_000.0


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


def tenant(name: str = "acme", priority: Priority = Priority.STANDARD, **quota: Any) -> TenantContext:
    return TenantContext(name, "key", priority, 1.0, name, QuotaLimits(**quota))


def request(
    prompt_len: int = 10, max_tokens: int = 20, priority: Priority = Priority.STANDARD, n: int = 1
) -> EngineRequest:
    return EngineRequest(
        request_id=f"r{time.monotonic_ns()}",
        prompt_token_ids=(1,) * prompt_len,
        sampling_params=SamplingParams(max_tokens=max_tokens, n=n),
        priority=priority,
        arrival_s=100.0,
    )


def record(t: TenantContext, prompt: int, completion: int, **kw: Any) -> UsageRecord:
    values: dict[str, Any] = dict(
        request_id="x",
        tenant_id=t.tenant_id,
        key_id="key",
        model=MODEL,
        endpoint=Endpoint.COMPLETIONS,
        usage=Usage(prompt, completion),
        outcome=Outcome.COMPLETED,
        finish_reasons=("length",),
        created_at=START,
        duration_s=1.0,
        ttft_s=0.1,
    )
    values.update(kw)
    return UsageRecord(**values)


def stats(**kw: Any) -> EngineStats:
    values: dict[str, Any] = dict(
        num_running=0, num_waiting=0, num_total_blocks=100, num_free_blocks=100, block_size=16
    )
    values.update(kw)
    return EngineStats(**values)


@dataclass
class Setup:
    clock: Clock
    budget: LocalBudget
    controller: AdmissionController
    metrics: AdmissionMetrics
    engine_stats: list[EngineStats] = field(default_factory=lambda: [stats()])


def make_setup() -> Setup:
    """A controller over an in-process budget on a frozen clock; `engine_stats[0]` is the snapshot."""
    from prometheus_client import CollectorRegistry

    clock = Clock()
    budget = LocalBudget(clock)
    metrics = AdmissionMetrics(CollectorRegistry())
    box = [stats()]
    controller = AdmissionController(
        lambda: box[0],
        budget,
        AdmissionConfig(max_queue_time_s=30.0, max_queued_tokens=1_000),
        metrics=metrics,
    )
    return Setup(clock, budget, controller, metrics, box)


def admit(s: Setup, t: TenantContext, *requests: EngineRequest) -> Admitted:
    return asyncio.run(s.controller(t, requests))


def sample(s: Setup, name: str, **labels: str) -> float:
    for metric in (s.metrics.admitted, s.metrics.rejected, s.metrics.slo, s.metrics.reserved_tokens,
                   s.metrics.refunded_tokens, s.metrics.ttft_calibration):  # fmt: skip
        for family in metric.collect():
            for smp in family.samples:
                if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                    return smp.value
    return 0.0
