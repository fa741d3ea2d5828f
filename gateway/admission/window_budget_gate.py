"""Admission against window budgets (`weir.tenancy.budgets.window_budgets`): tokens and money over windows.

After the per-minute budgets admitted a request, the budgets over windows of its tenant and of
its key (if any are set) each take the request's reservation in one database transaction:

- `tokens` budgets take the tokens admission reserved (prompt + max_tokens per sequence);
- `micros` budgets take the most the request may spend at the dearest price in effect (the model
  version is picked later; one price table, `weir.tenancy.budgets.prices`); nothing if no price is set.

A hard limit that would be passed refuses: 429 with `Retry-After` = until enough of the window is
over (its reset for calendar windows), or 400 `request_too_large` if the reservation alone is
over the limit. A soft limit reached (at a settlement: once the real use is known) counts
`weir_budget_soft_limit_alerts`, once per window (and the store writes an audit event). Settlement replaces each reservation by what the request used: its billed
tokens, or its spend at the price of the version that served it (as its usage record's).

Which principals have budgets is read from the database at most every `refresh_s` (the auth
cache TTL), and again before the admin API answers a change made on this replica
(`refresh_now`), so a request of a principal without budgets costs one dictionary lookup. A
change reaches the other replicas within `refresh_s`.

Traffic a budget did not see at admission is still counted: the store seeds a new budget with the
usage records of its current window (`weir.tenancy.budgets.window_budgets`), and a request admitted without a
charge for a budget its principal has by the time it settles (one in flight when the budget was
set, or admitted by a replica that had not read it yet) is charged what it used in the bucket of
its arrival. Settlements are written in order on one worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from weir.engine.client import EngineRequest
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.http.errors import BadRequestError, RateLimitError, ServiceUnavailableError
from weir.tenancy.budgets.money import TokenPrices, format_micros
from weir.tenancy.budgets.prices import PriceBook, PriceRepo
from weir.tenancy.budgets.window_budget_records import Budget, BudgetUnit, Charge, Refusal, SoftAlert
from weir.tenancy.budgets.window_budgets import WindowBudgetStore
from weir.tenancy.context import TenantContext
from weir.tenancy.store.db import Database

logger = logging.getLogger(__name__)


class WindowBudgetMetrics:
    """Soft-limit alerts and hard-limit refusals of window budgets."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("tenant", "scope", "unit", "window")
        self.alerts = Counter(
            "weir_budget_soft_limit_alerts",
            "Windows whose count reached a budget's soft limit (the request was served).",
            labels,
            registry=registry,
        )
        self.refusals = Counter(
            "weir_budget_hard_limit_refusals",
            "Requests refused by a budget's hard limit.",
            labels,
            registry=registry,
        )

    @staticmethod
    def _labels(budget: Budget) -> tuple[str, str, str, str]:
        return (
            budget.tenant,
            "key" if budget.key_id else "tenant",
            budget.unit.value,
            budget.window.describe(),
        )

    def alert(self, alert: SoftAlert) -> None:
        self.alerts.labels(*self._labels(alert.budget)).inc()

    def refuse(self, budget: Budget) -> None:
        self.refusals.labels(*self._labels(budget)).inc()


@dataclass(frozen=True)
class WindowHold:
    """What one admitted request holds in window budgets."""

    charges: tuple[Charge, ...]


_NOTHING = WindowHold(())


def _what_is_limited(budget: Budget) -> str:
    whose = "this API key" if budget.key_id else "the tenant"
    unit = "tokens" if budget.unit is BudgetUnit.TOKENS else "spend"
    return f"{unit} per {budget.window.describe()} for {whose}"


def _amount_text(budget: Budget, amount: int) -> str:
    return str(amount) if budget.unit is BudgetUnit.TOKENS else format_micros(amount)


def refusal_error(refusal: Refusal) -> RateLimitError | BadRequestError:
    """The answer to a refusal: 429 with Retry-After, or 400 when no wait can help."""
    b = refusal.budget
    assert b.hard_limit is not None
    what = _what_is_limited(b)
    if refusal.retry_after_s is None:
        return BadRequestError(
            f"Request too large: it may use {_amount_text(b, refusal.requested)} and the budget of {what} "
            f"is {_amount_text(b, b.hard_limit)}. Reduce the prompt, max_tokens, n or beam_width.",
            param="max_tokens",
            code="request_too_large",
        )
    retry = max(refusal.retry_after_s, 0.001)
    left = max(0, b.hard_limit - refusal.used)
    return RateLimitError(
        f"Budget exceeded: {what}. Limit {_amount_text(b, b.hard_limit)}, remaining {_amount_text(b, left)}, "
        f"requested {_amount_text(b, refusal.requested)}. Please try again in {retry:.0f}s.",
        headers={
            "retry-after": str(max(1, math.ceil(retry))),
            "retry-after-ms": str(math.ceil(retry * 1000)),
        },
        code="budget_exceeded",
    )


class WindowBudgetGate:
    """Takes and settles a request's window budgets; see the module docstring."""

    def __init__(
        self,
        store: WindowBudgetStore,
        prices: PriceRepo,
        metrics: WindowBudgetMetrics | None = None,
        *,
        refresh_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prices = prices
        self.metrics = metrics
        self.refresh_s = refresh_s
        self.clock = clock
        self._budgets: dict[tuple[str, str | None], tuple[Budget, ...]] = {}
        self._book = PriceBook(())
        self._loaded_at = -math.inf
        self._generation = 0  # bumped by every invalidation; a load that saw a bump is stale
        self._refresh_lock = asyncio.Lock()
        self._settler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weir-budget-settle")

    @classmethod
    def on_database(
        cls, db: Database, metrics: WindowBudgetMetrics | None = None, *, refresh_s: float = 5.0
    ) -> WindowBudgetGate:
        """Budgets and prices on the tenancy database; `weir serve` re-reads them every auth cache
        TTL (the delay of any other admin change reaching a replica)."""
        return cls(WindowBudgetStore(db), PriceRepo(db), metrics, refresh_s=refresh_s)

    def invalidate(self) -> None:
        """Read budgets and prices again before the next request (after an admin change)."""
        self._generation += 1
        self._loaded_at = -math.inf

    async def refresh_now(self) -> None:
        """Read budgets and prices again now: the admin API awaits this after a committed change,
        so the change applies to every request admitted (and settled) after its answer."""
        self.invalidate()
        try:
            await self._fresh()
        except Exception:  # the change is committed: the next request's read applies it
            logger.exception("window budgets cannot be read after an admin change")

    def _load(self) -> None:
        budgets: dict[tuple[str, str | None], list[Budget]] = {}
        for b in self.store.list_budgets():
            budgets.setdefault((b.tenant, b.key_id), []).append(b)
        self._budgets = {k: tuple(v) for k, v in budgets.items()}
        self._book = self.prices.price_book()
        self._loaded_at = time.monotonic()

    async def _fresh(self) -> None:
        if time.monotonic() - self._loaded_at < self.refresh_s:
            return
        async with self._refresh_lock:
            if time.monotonic() - self._loaded_at < self.refresh_s:
                return  # read by the request this one waited for
            while True:
                generation = self._generation
                try:
                    await asyncio.to_thread(self._load)
                except BaseException:
                    self._loaded_at = time.monotonic()  # after a failure too: retried next period
                    raise
                if generation == self._generation:
                    return
                # An admin change was committed while this load ran: what it read may predate
                # the change, so read again rather than keep it for a period.

    def budgets_of(self, tenant: TenantContext) -> tuple[Budget, ...]:
        return self._budgets.get((tenant.tenant_id, None), ()) + self._budgets.get(
            (tenant.tenant_id, tenant.key_id), ()
        )

    def _dearest(self, when: dt.datetime) -> TokenPrices | None:
        return self._book.dearest(when)

    async def reserve(
        self, tenant: TenantContext, requests: Sequence[EngineRequest], num_tokens: int
    ) -> WindowHold:
        """Take the request's reservation from every window budget of its tenant and key, or raise
        the refusal (429 or 400); 503 if the database cannot be reached."""
        try:
            await self._fresh()
        except Exception:
            logger.exception("window budgets cannot be read; using the last ones read")
        budgets = self.budgets_of(tenant)
        if not budgets:
            return _NOTHING
        now = self.clock()
        prompt = sum(len(r.prompt_token_ids) for r in requests)
        prices = self._dearest(dt.datetime.fromtimestamp(now, dt.UTC))
        money = prices.most(prompt, max(0, num_tokens - prompt)) if prices is not None else 0
        amounts = [(b, num_tokens if b.unit is BudgetUnit.TOKENS else money) for b in budgets]
        try:
            result = await asyncio.to_thread(self.store.take, amounts, now)
        except Exception as exc:
            logger.exception("window budgets of %s unavailable", tenant.tenant_id)
            raise ServiceUnavailableError(
                "the budget cannot be checked right now; retry later",
                code="budget_unavailable",
                headers={"retry-after": "1"},
            ) from exc
        if result.refusal is not None:
            if self.metrics is not None:
                self.metrics.refuse(result.refusal.budget)
            raise refusal_error(result.refusal)
        return WindowHold(result.charges)

    def _count(self, alerts: Sequence[SoftAlert]) -> None:
        for alert in alerts:
            logger.warning(
                "budget soft limit reached: %s of %s used %s",
                _what_is_limited(alert.budget),
                alert.budget.tenant,
                _amount_text(alert.budget, alert.used),
            )
            if self.metrics is not None:
                self.metrics.alert(alert)

    def actual(self, charge: Charge, record: UsageRecord) -> int:
        """What the request used, in the charge's unit."""
        usage = record.usage
        if charge.budget.unit is BudgetUnit.TOKENS:
            return usage.billed_total_tokens
        when = dt.datetime.fromtimestamp(record.created_at, dt.UTC)
        price = self._book.price_at(record.model_version, record.model, when)
        if price is None:
            return 0
        prompt = usage.billed_prompt_tokens
        return price.prices.spend(prompt, min(usage.cached_tokens, prompt), usage.billed_completion_tokens)

    def _uncharged(self, hold: WindowHold, record: UsageRecord) -> tuple[Charge, ...]:
        """Zero charges, in the bucket of the request's arrival, for the budgets its principal has
        now that its admission did not charge (set while it ran, or not yet read at admission)."""
        held = {c.budget.id for c in hold.charges}
        now_known = {
            b.id: b
            for principal in ((record.tenant_id, None), (record.tenant_id, record.key_id))
            for b in self._budgets.get(principal, ())
        }
        return tuple(
            Charge(b, b.window.bucket_start(record.created_at), 0)
            for b in now_known.values()
            if b.id not in held
        )

    def settle(self, hold: WindowHold, record: UsageRecord) -> None:
        """Charge what the request used instead of its reservation; never blocks, never raises."""
        late = [(c, self.actual(c, record)) for c in self._uncharged(hold, record)]
        pairs = [(c, self.actual(c, record)) for c in hold.charges] + [(c, n) for c, n in late if n > 0]
        if not pairs:
            return
        charges, actual = tuple(c for c, _ in pairs), [n for _, n in pairs]
        now = self.clock()

        def write() -> None:
            try:
                self._count(self.store.settle(charges, actual, now))
            except Exception:
                logger.exception("window budget settlement of %s lost", record.request_id)

        try:
            self._settler.submit(write)
        except RuntimeError:  # after close (shutdown): nothing can be written any more
            logger.error("window budget settlement of %s after shutdown, lost", record.request_id)

    def flush(self) -> None:
        """Wait until the settlements submitted so far are written."""
        self._settler.submit(lambda: None).result()

    def close(self) -> None:
        """Write the pending settlements (after the requests settled), then stop the worker."""
        self._settler.shutdown(wait=True)
