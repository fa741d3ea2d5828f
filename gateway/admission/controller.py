"""Admission control: token budgets, SLO-aware early rejection and a queue bounded in tokens.

Awaited by the routes before a request reaches the engine (`weir.gateway.admission.accounting.Admission`). In
order, cheapest and least committal first:

1. Concurrency: at most `max_concurrent` requests of a tenant in flight on this replica (429).
2. Queue bound: the engine's waiting prompt tokens plus this request's must stay within
   `max_queued_tokens` (503 `queue_full`), so nothing piles up without limit.
3. SLO: an interactive request whose tenant has a TTFT objective is rejected at once when the
   predicted TTFT (`weir.gateway.admission.slo`) misses it (503 `slo_unattainable`) rather than waiting to miss.
   An interactive tenant without an objective of its own is held to its class's TTFT target
   loosely: refused only where the prediction misses it by more than `class_refuse_factor` (3x by
   default: 6 s against the CPU's 2 s), a request that would wait 10-20 s on a loaded machine
   (issue 58), never one that the noise of a prediction puts a little over the target.
   The prediction is scaled by the bias its class's admitted requests showed, actual TTFT over
   predicted (`weir.gateway.admission.ttft_calibration`), so a model that runs pessimistic does not
   refuse what the machine could serve in time. Both targets count: a request that would find no
   seat under the running cap, or whose stream would tip the running streams' steps over their
   ITL target, is refused the same way (`weir.gateway.admission.stream_outlook`, issue 58).
4. Budget: what the request may compute is reserved from the tenant's tokens-per-minute bucket
   and daily cap: the prompt once, plus max_tokens for each sequence (each of the n choices, or
   each of the beam_width beams of a beam search). A request without max_tokens reserves a
   bounded default (the tenant's `default_max_tokens_reservation`, else the server's), not the
   whole context, though it may still generate up to the context. 429 `rate_limit_exceeded` with
   Retry-After and `x-ratelimit-*` headers, as OpenAI sends them; a request larger than the
   tenant's whole budget can never be admitted, and gets a 400 `request_too_large` that clients
   do not retry (`weir.gateway.admission.refusal_errors`; what a request reserves:
   `weir.gateway.admission.request_tokens`). Local budgets or database leases: any `weir.tenancy.budgets.quotas.TokenBudget`.
5. Window budgets: tokens and money of the tenant and the key over minute, hour, day, month or
   rolling windows, with soft and hard limits (`weir.gateway.admission.window_budget_gate`); a hard limit
   refuses with 429 and Retry-After until the window has room, and what step 4 granted goes back.

Admitted requests get a queue deadline (`max_queue_time_s` after arrival): the engine aborts them
if they are still waiting then, and the client gets 503 `deadline_exceeded`. Settlement, when the
request completes, fails or is cancelled, charges what was computed (`Usage.billed_total_tokens`):
the unused part of the reservation goes back, and a request that used more than it reserved
(no max_tokens) leaves the overshoot as debt on the tenant's bucket, which its next admissions
wait out. A request cancelled before its first token is charged the prompt tokens the engine had
computed for it (cached ones included, as for a completed request); one that computed nothing
(aborted in the queue, refused) used nothing.

The only queue is the engine's: this module decides yes or no at once and never holds requests.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from weir.engine.client import EngineRequest
from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority
from weir.gateway.admission.accounting import Admitted, Outcome, UsageRecord
from weir.gateway.admission.refusal_errors import (
    rate_limit_error,
    rate_limit_headers,
    retry_after_headers,
    too_large_error,
)
from weir.gateway.admission.request_tokens import num_queued_tokens, num_reserved_tokens, num_sequences
from weir.gateway.admission.slo import RecentAdmissions, predict_ttft
from weir.gateway.admission.stream_outlook import stream_outlook
from weir.gateway.admission.ttft_calibration import TTFTCalibration
from weir.gateway.admission.window_budget_gate import WindowBudgetGate, WindowBudgetMetrics, WindowHold
from weir.gateway.http.errors import BadRequestError, RateLimitError, ServiceUnavailableError
from weir.gateway.metrics.admission_metrics import AdmissionMetrics, RejectReason, SLOResult
from weir.gateway.settings.settings import Settings
from weir.tenancy.budgets.principal_budgets import PrincipalBudgets, Reservation
from weir.tenancy.budgets.quotas import ConcurrencyLimiter, Denial, LimitKind, LocalBudget, TokenBudget
from weir.tenancy.context import QuotaLimits, TenantContext

logger = logging.getLogger(__name__)

_REASON_OF = {
    LimitKind.TOKENS_PER_MINUTE: RejectReason.TOKENS_PER_MINUTE,
    LimitKind.TOKENS_PER_DAY: RejectReason.TOKENS_PER_DAY,
    LimitKind.MAX_CONCURRENT: RejectReason.MAX_CONCURRENT,
    LimitKind.REQUESTS_PER_MINUTE: RejectReason.REQUESTS_PER_MINUTE,
}


@dataclass(frozen=True)
class AdmissionConfig:
    """Admission knobs (from `weir.gateway.settings.settings`)."""

    max_queue_time_s: float | None = 300.0  # None: requests may wait in the queue indefinitely
    max_queued_tokens: int | None = 65_536  # None: no bound on waiting prompt tokens
    slo_margin: float = 1.0  # reject when predicted TTFT > ttft_slo * margin
    # Interactive tenants without a TTFT objective: reject when predicted TTFT > the class's target
    # times this (0: never judge them).
    class_refuse_factor: float = 3.0
    # Output tokens reserved per sequence when a request gives no max_tokens (tenants may override).
    default_max_tokens_reservation: int = 1024

    def __post_init__(self) -> None:
        if self.default_max_tokens_reservation < 1:
            raise ValueError(
                f"default_max_tokens_reservation must be >= 1, got {self.default_max_tokens_reservation}"
            )
        if self.max_queue_time_s is not None and self.max_queue_time_s <= 0:
            raise ValueError(f"max_queue_time_s must be > 0 or None, got {self.max_queue_time_s}")
        if self.max_queued_tokens is not None and self.max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be >= 1 or None, got {self.max_queued_tokens}")
        if not (math.isfinite(self.slo_margin) and self.slo_margin > 0):
            raise ValueError(f"slo_margin must be > 0, got {self.slo_margin}")
        if not (math.isfinite(self.class_refuse_factor) and self.class_refuse_factor >= 0):
            raise ValueError(f"class_refuse_factor must be >= 0, got {self.class_refuse_factor}")


def met_slo(record: UsageRecord, quota: QuotaLimits, num_choices: int) -> bool:
    """Whether a completed request met its tenant's TTFT and TPOT objectives (none: met)."""
    if quota.ttft_slo_ms is not None and (record.ttft_s is None or record.ttft_s * 1000 > quota.ttft_slo_ms):
        return False
    per_choice = record.usage.completion_tokens / max(1, num_choices)
    if quota.tpot_slo_ms is not None and record.ttft_s is not None and per_choice > 1:
        tpot_ms = (record.duration_s - record.ttft_s) * 1000 / (per_choice - 1)
        return tpot_ms <= quota.tpot_slo_ms
    return True


class AdmissionController:
    """The gateway's `Admission`: call it with the tenant and its engine requests."""

    def __init__(
        self,
        stats: Callable[[], EngineStats],
        budget: TokenBudget | PrincipalBudgets,
        config: AdmissionConfig | None = None,
        *,
        metrics: AdmissionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        closers: Sequence[Callable[[], None]] = (),
        window_budgets: WindowBudgetGate | None = None,
    ) -> None:
        self.stats = stats
        # A plain TokenBudget is the tenant's tokens; keys and request counts are then in-process.
        self.budgets = budget if isinstance(budget, PrincipalBudgets) else PrincipalBudgets(budget)
        self.config = config or AdmissionConfig()
        self.metrics = metrics
        self.clock = clock
        self.concurrency = ConcurrencyLimiter()
        self.key_concurrency = ConcurrencyLimiter()  # per key, with the key's own cap
        self._recent = RecentAdmissions()
        self.calibration = TTFTCalibration()  # the predictions' bias, from the TTFTs admitted requests got
        self._closers = tuple(closers)
        # Token and money budgets over windows (issue 25), after the per-minute budgets.
        self.window_budgets = window_budgets

    @property
    def budget(self) -> TokenBudget:
        """The tenant's token budget."""
        return self.budgets.tenant_tokens

    @budget.setter
    def budget(self, budget: TokenBudget) -> None:
        self.budgets.tenant_tokens = budget

    async def start(self) -> None:
        """Lifespan start: the budgets' background work (lease expiry)."""
        await self.budgets.start()

    async def close(self) -> None:
        """Lifespan end, after requests settled: return leased budget, then release resources."""
        try:
            await self.budgets.close()
        finally:
            for close in self._closers:
                close()

    def _reject(self, tenant: str, reason: RejectReason) -> None:
        if self.metrics is not None:
            self.metrics.count_rejected(tenant, reason)

    async def __call__(self, tenant: TenantContext, requests: Sequence[EngineRequest]) -> Admitted:
        name, quota = tenant.tenant_id, tenant.quota
        denial = self.concurrency.try_acquire(name, quota)
        if denial is not None:
            self._reject(name, RejectReason.MAX_CONCURRENT)
            raise rate_limit_error(denial)
        denial = self.key_concurrency.try_acquire(tenant.key_id, tenant.key_quota)
        if denial is not None:
            self.concurrency.release(name)
            self._reject(name, RejectReason.MAX_CONCURRENT)
            raise rate_limit_error(denial)
        try:
            reservation, predicted_s = await self._check_and_reserve(tenant, requests)
            hold = await self._reserve_windows(tenant, requests, reservation)
        except BaseException:
            self.concurrency.release(name)
            self.key_concurrency.release(tenant.key_id)
            raise
        grant = reservation.tenant_tokens
        priority = requests[0].priority if requests else tenant.priority
        self._recent.add(priority, num_queued_tokens(requests), sum(map(num_sequences, requests)))
        if self.metrics is not None:
            self.metrics.count_admitted(name, priority.name.lower())
            self.metrics.count_tokens(name, reserved=0 if grant.unlimited else grant.num_tokens)
        deadline_s = None
        if self.config.max_queue_time_s is not None and requests:
            deadline_s = requests[0].arrival_s + self.config.max_queue_time_s
            requests = [replace(r, deadline_s=r.arrival_s + self.config.max_queue_time_s) for r in requests]
        num_choices = sum(r.sampling_params.n for r in requests)
        return Admitted(
            self._settler(
                tenant,
                reservation,
                deadline_s,
                num_choices,
                hold,
                None if predicted_s is None else (priority, predicted_s, self._waited_s(requests)),
            ),
            tuple(requests),
            headers=tuple(rate_limit_headers(reservation.requests, reservation.tokens).items()),
        )

    async def _check_and_reserve(
        self, tenant: TenantContext, requests: Sequence[EngineRequest]
    ) -> tuple[Reservation, float | None]:
        """The checks up to the token budget; with the reservation, the raw (uncalibrated) TTFT
        prediction the SLO check made, None when it made none."""
        name, quota = tenant.tenant_id, tenant.quota
        stats = self.stats()
        self._recent.observe(stats)
        queued = num_queued_tokens(requests)
        bound = self.config.max_queued_tokens
        if bound is not None and stats.num_waiting_tokens + self._recent.total() + queued > bound:
            self._reject(name, RejectReason.QUEUE_FULL)
            excess = stats.num_waiting_tokens + self._recent.total() + queued - bound
            rate = stats.prefill_tokens_per_s
            raise ServiceUnavailableError(
                f"the server's queue is full ({bound} prompt tokens waiting at most); retry later",
                code="queue_full",
                headers=retry_after_headers(excess / rate if rate > 0 else 1.0),
            )
        priority = requests[0].priority if requests else tenant.priority
        predicted_s: float | None = None
        objective = self._ttft_objective(stats, priority, quota.ttft_slo_ms)
        if objective is not None:
            slo_s, owner = objective
            itl_s = requests[0].latency.itl_s if requests else None
            raw = predict_ttft(stats, priority, queued, self._recent.ahead(priority), itl_s)
            if raw is not None:
                predicted_s = raw.seconds
                prediction = self.calibration.apply(priority, raw, name)
                if self.metrics is not None:
                    self.metrics.observe_prediction(name, prediction.seconds)
                if prediction.seconds > slo_s:
                    self._reject(name, RejectReason.SLO_UNATTAINABLE)
                    raise ServiceUnavailableError(
                        f"the predicted time to first token ({prediction.seconds * 1000:.0f} ms, "
                        f"{prediction.tokens_ahead} tokens queued ahead) exceeds {owner}; retry later",
                        code="slo_unattainable",
                        headers=retry_after_headers(prediction.seconds - slo_s),
                    )
            if quota.ttft_slo_ms is not None:
                self._check_stream(
                    name, stats, priority, itl_s, quota.ttft_slo_ms / 1000, sum(map(num_sequences, requests))
                )
        num_tokens = self._reservation(tenant, requests)
        try:
            result = await self.budgets.take(tenant, num_tokens)
        except Exception as exc:
            logger.exception("token budget of %s unavailable", name)
            self._reject(name, RejectReason.BUDGET_UNAVAILABLE)
            raise ServiceUnavailableError(
                "the token budget cannot be checked right now; retry later",
                code="budget_unavailable",
                headers=retry_after_headers(1.0),
            ) from exc
        if isinstance(result, Denial):
            if result.request_too_large:
                self._reject(name, RejectReason.REQUEST_TOO_LARGE)
                per = "minute" if result.limit is LimitKind.TOKENS_PER_MINUTE else "day"
                raise too_large_error(num_tokens, result.limit_value, per)
            self._reject(name, _REASON_OF[result.limit])
            raise rate_limit_error(result)
        return result, predicted_s

    def _ttft_objective(
        self, stats: EngineStats, priority: Priority, ttft_slo_ms: int | None
    ) -> tuple[float, str] | None:
        """The TTFT an interactive request is refused past, in seconds, and whose it is (for the
        error): the tenant's objective (times `slo_margin`), else its class's target times
        `class_refuse_factor`; None for other classes or where neither applies."""
        if priority is not Priority.INTERACTIVE:
            return None
        if ttft_slo_ms is not None:
            return (
                ttft_slo_ms / 1000 * self.config.slo_margin,
                f"this API key's objective of {ttft_slo_ms} ms",
            )
        factor = self.config.class_refuse_factor
        target_s = stats.class_targets.of(priority).ttft_s
        if factor <= 0 or target_s is None:
            return None
        return target_s * factor, (
            f"{factor:g} times the interactive class's target of {target_s * 1000:.0f} ms "
            "(set a ttft_slo_ms on the tenant for an objective of its own)"
        )

    def _check_stream(
        self,
        name: str,
        stats: EngineStats,
        priority: Priority,
        itl_s: float | None,
        ttft_s: float,
        num_seqs: int,
    ) -> None:
        """Refuse (503 `slo_unattainable`) a request that cannot meet both targets beside the
        running streams: no seat under the running cap, or its row tips their step over the ITL
        target (`weir.gateway.admission.stream_outlook`). Retry-After: its TTFT target, about the time
        in which running streams end and seats and rows free up."""
        outlook = stream_outlook(stats, priority, self._recent.seqs_ahead(priority), num_seqs)
        target = itl_s if itl_s is not None else stats.class_targets.of(priority).itl_s
        if outlook is None or not outlook.refuses(target):
            return
        self._reject(name, RejectReason.SLO_UNATTAINABLE)
        if outlook.seats_full:
            why = "every running seat is taken by requests of its class or better"
        else:
            why = (
                f"its stream beside the {outlook.rows} running would make every step "
                f"{outlook.gap_s * 1000:.0f} ms, over the objective of {(target or 0.0) * 1000:.0f} ms "
                "between tokens"
            )
        raise ServiceUnavailableError(
            f"this request cannot meet both its time to first token and its time between tokens: {why}; "
            "retry later",
            code="slo_unattainable",
            headers=retry_after_headers(ttft_s),
        )

    def _waited_s(self, requests: Sequence[EngineRequest]) -> float:
        """Seconds since the request arrived (prompt rendering, tokenization, grammar compile)."""
        return max(0.0, self.clock() - requests[0].arrival_s) if requests else 0.0

    def _reservation(self, tenant: TenantContext, requests: Sequence[EngineRequest]) -> int:
        """Tokens to reserve; a defaulted max_tokens is reduced to fit the tenant's and key's whole budgets."""
        quota = tenant.limits  # the tighter of the tenant's and the key's
        default = quota.default_max_tokens_reservation or self.config.default_max_tokens_reservation
        num_tokens = num_reserved_tokens(requests, default)
        limits = [v for v in (quota.tokens_per_minute, quota.tokens_per_day) if v is not None]
        if not limits or num_tokens <= min(limits):
            return num_tokens
        limit = min(limits)
        per = "minute" if limit == quota.tokens_per_minute else "day"
        if any(r.max_tokens_defaulted for r in requests):
            # The client asked for no particular length: reserve what the budget can hold (at
            # least one token per sequence); the rest, if used, is charged as debt.
            floor = num_reserved_tokens(requests, 1)
            if floor <= limit:
                return limit
            num_tokens = floor
        self._reject(tenant.tenant_id, RejectReason.REQUEST_TOO_LARGE)
        raise too_large_error(num_tokens, limit, per)

    async def _reserve_windows(
        self, tenant: TenantContext, requests: Sequence[EngineRequest], reservation: Reservation
    ) -> WindowHold | None:
        """The window budgets' part; a refusal gives back what the per-minute budgets granted."""
        if self.window_budgets is None:
            return None
        try:
            return await self.window_budgets.reserve(tenant, requests, reservation.tenant_tokens.num_tokens)
        except BaseException as exc:
            self.budgets.give_back(reservation)
            if isinstance(exc, RateLimitError | BadRequestError):
                self._reject(tenant.tenant_id, RejectReason.WINDOW_BUDGET)
            raise

    def _settler(
        self,
        tenant: TenantContext,
        reservation: Reservation,
        deadline_s: float | None,
        num_choices: int,
        hold: WindowHold | None = None,
        # its class, raw predicted TTFT (from admission) and how long it had waited before admission
        prediction: tuple[Priority, float, float] | None = None,
    ) -> Callable[[UsageRecord], None]:
        settled = False
        grant = reservation.tenant_tokens

        def settle(record: UsageRecord) -> None:
            nonlocal settled
            if settled:  # exactly once, whatever calls it
                return
            settled = True
            name = tenant.tenant_id
            self.concurrency.release(name)
            self.key_concurrency.release(tenant.key_id)
            # What was computed: a request cancelled during its prefill pays for the prefill
            # (engine-reported); one that computed nothing (aborted in the queue) pays nothing.
            usage = record.usage
            used = usage.billed_total_tokens
            self.budgets.settle(reservation, used)
            if hold is not None and self.window_budgets is not None:
                self.window_budgets.settle(hold, record)
            if prediction is not None and record.ttft_s is not None:
                # The prediction runs from admission; the record's TTFT from arrival. Compared
                # as they were, a tenant's slow grammar compiles or tokenization (before
                # admission) would raise the factor of its whole class, and with it the 503s
                # of every other tenant of that class.
                priority, predicted_s, waited_s = prediction
                self.calibration.observe(priority, predicted_s, record.ttft_s - waited_s, name)
                if self.metrics is not None:
                    factor = self.calibration.state(priority).factor
                    self.metrics.set_ttft_calibration(priority.name.lower(), factor)
            if self.metrics is None:
                return
            if not grant.unlimited:
                self.metrics.count_tokens(name, refunded=max(0, grant.num_tokens - used))
            if record.outcome is Outcome.COMPLETED:
                result = SLOResult.MET if met_slo(record, tenant.quota, num_choices) else SLOResult.MISSED
                self.metrics.count_slo(name, result)
            elif (
                record.outcome is Outcome.FAILED
                and record.usage.completion_tokens == 0
                and deadline_s is not None
                and self.clock() >= deadline_s
            ):
                self.metrics.count_rejected(name, RejectReason.DEADLINE_EXCEEDED)

        return settle


def build_admission(
    settings: Settings,
    stats: Callable[[], EngineStats],
    metrics: AdmissionMetrics | None = None,
    window_metrics: WindowBudgetMetrics | None = None,
) -> AdmissionController:
    """The admission of `weir serve`: leases from PostgreSQL, in-process budgets on SQLite.

    SQLite means one replica (see `weir.tenancy.budgets.leases`), whose own buckets are exact and cost no
    database round trip.
    """
    from weir.tenancy.store.db import Database

    config = AdmissionConfig(
        max_queue_time_s=settings.max_queue_time_s or None,
        max_queued_tokens=settings.max_queued_tokens or None,
        default_max_tokens_reservation=settings.default_max_tokens_reservation,
        class_refuse_factor=settings.class_refuse_factor,
    )
    db = Database(settings.resolved_database_url)
    gate = WindowBudgetGate.on_database(db, window_metrics, refresh_s=settings.auth_cache_ttl_s)
    closers = (gate.close, db.dispose)  # pending settlements written before the pool closes
    if db.backend == "sqlite":
        return AdmissionController(
            stats,
            PrincipalBudgets(LocalBudget()),
            config,
            metrics=metrics,
            closers=closers,
            window_budgets=gate,
        )
    from weir.tenancy.budgets.leases import LeasedBudget, LeaseStore, SubjectRows

    def leased(rows: SubjectRows | None = None) -> LeasedBudget:
        return LeasedBudget(
            LeaseStore(db, rows=rows), lease_tokens=settings.lease_tokens, lease_ttl_s=settings.lease_ttl_s
        )

    budgets = PrincipalBudgets(
        tenant_tokens=leased(),
        key_tokens=leased(SubjectRows("key:tokens:")),
        tenant_requests=leased(SubjectRows("tenant:requests:")),
        key_requests=leased(SubjectRows("key:requests:")),
    )
    return AdmissionController(stats, budgets, config, metrics=metrics, closers=closers, window_budgets=gate)
