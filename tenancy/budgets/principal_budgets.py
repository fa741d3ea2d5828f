"""The budgets of both principals of a request, its tenant and its API key, taken all or nothing.

A key's limits are nested in its tenant's: a request must fit both, so it is counted against the
tenant's budgets and against the key's, each with its own limit (the tighter one is the one that
refuses). Four budgets, each a `weir.tenancy.budgets.quotas.TokenBudget` (in-process, or leased from the
database for several replicas: the same mechanism as the tenant's tokens, not a second one):

- the tenant's tokens (tokens per minute, per day),
- the key's tokens,
- the tenant's requests per minute,
- the key's requests per minute (a request is one "token" of a bucket holding `rpm`).

A refusal by any of them gives back what the others granted (a refund of an unused grant), so a
refused request counts against nothing. Concurrency caps stay per replica
(`weir.tenancy.budgets.quotas.ConcurrencyLimiter`), for keys as for tenants.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from weir.tenancy.budgets.quotas import Denial, Grant, LimitKind, LocalBudget, TokenBudget
from weir.tenancy.context import QuotaLimits, TenantContext


@dataclass(frozen=True)
class RateWindow:
    """One per-minute limit as OpenAI's `x-ratelimit-*` headers report it."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class Reservation:
    """What one request holds: one grant per budget, and the windows for its headers."""

    tenant_tokens: Grant
    key_tokens: Grant
    tenant_requests: Grant
    key_requests: Grant
    requests: RateWindow | None  # None: neither principal has a requests-per-minute limit
    tokens: RateWindow | None  # None: neither has a tokens-per-minute limit


def requests_limits(rpm: int | None) -> QuotaLimits:
    """A requests-per-minute limit as a budget's limits: a bucket of `rpm` one-token requests."""
    return QuotaLimits(tokens_per_minute=rpm)


def _window(limit: int | None, grant: Grant) -> RateWindow | None:
    if limit is None or grant.remaining is None:
        return None
    return RateWindow(limit, max(0, grant.remaining), grant.reset_s)


def tighter_window(a: RateWindow | None, b: RateWindow | None) -> RateWindow | None:
    """The window that binds first: the one with fewer left (then the smaller limit)."""
    if a is None or b is None:
        return a if b is None else b
    return min(a, b, key=lambda w: (w.remaining, w.limit))


def _requests_denial(denial: Denial, whose: str) -> Denial:
    """A requests budget's refusal (which counts requests as tokens), in words about requests."""
    retry = denial.retry_after_s if denial.retry_after_s is not None else denial.reset_s
    message = (
        f"Rate limit reached: requests per minute ({whose}). Limit {denial.limit_value}, remaining "
        f"{max(0, denial.remaining)}. Please try again in {retry:.1f}s."
    )
    return replace(denial, limit=LimitKind.REQUESTS_PER_MINUTE, retry_after_s=retry, message=message)


def _key_denial(denial: Denial) -> Denial:
    return replace(
        denial, message=denial.message.replace("Rate limit reached:", "Rate limit reached (API key):")
    )


class PrincipalBudgets:
    """The four budgets of a request's tenant and key; `take` is all or nothing."""

    def __init__(
        self,
        tenant_tokens: TokenBudget,
        key_tokens: TokenBudget | None = None,
        tenant_requests: TokenBudget | None = None,
        key_requests: TokenBudget | None = None,
    ) -> None:
        self.tenant_tokens = tenant_tokens
        self.key_tokens = key_tokens if key_tokens is not None else LocalBudget()
        self.tenant_requests = tenant_requests if tenant_requests is not None else LocalBudget()
        self.key_requests = key_requests if key_requests is not None else LocalBudget()

    def _all(self) -> Iterator[TokenBudget]:
        yield from (self.tenant_tokens, self.key_tokens, self.tenant_requests, self.key_requests)

    async def take(self, context: TenantContext, num_tokens: int) -> Reservation | Denial:
        """Count one request of `num_tokens` against the tenant and the key, or say which refused.

        Requests first (cheap, and a refused request must not hold tokens), then tokens. On a
        refusal every grant already taken is given back unused. An exception (a database down)
        also gives back what was granted, then propagates.
        """
        tenant, key = context.quota, context.key_quota
        taken: list[tuple[TokenBudget, Grant]] = []
        try:
            steps: tuple[tuple[TokenBudget, str, QuotaLimits, int, bool], ...] = (
                (
                    self.tenant_requests,
                    context.tenant_id,
                    requests_limits(tenant.requests_per_minute),
                    1,
                    False,
                ),
                (self.key_requests, context.key_id, requests_limits(key.requests_per_minute), 1, True),
                (self.tenant_tokens, context.tenant_id, tenant, num_tokens, False),
                (self.key_tokens, context.key_id, key, num_tokens, True),
            )
            for i, (budget, name, limits, n, is_key) in enumerate(steps):
                result = await budget.take(name, limits, n)
                if isinstance(result, Denial):
                    self._give_back(taken)
                    if i < 2:
                        return _requests_denial(result, "this API key" if is_key else "the tenant")
                    return _key_denial(result) if is_key else result
                taken.append((budget, result))
        except BaseException:
            self._give_back(taken)
            raise
        tenant_requests, key_requests, tenant_tokens, key_tokens = (g for _, g in taken)
        return Reservation(
            tenant_tokens=tenant_tokens,
            key_tokens=key_tokens,
            tenant_requests=tenant_requests,
            key_requests=key_requests,
            requests=tighter_window(
                _window(tenant.requests_per_minute, tenant_requests),
                _window(key.requests_per_minute, key_requests),
            ),
            tokens=tighter_window(
                _window(tenant.tokens_per_minute, tenant_tokens), _window(key.tokens_per_minute, key_tokens)
            ),
        )

    @staticmethod
    def _give_back(taken: list[tuple[TokenBudget, Grant]]) -> None:
        for budget, grant in taken:
            with contextlib.suppress(Exception):
                budget.settle(grant, 0)

    def give_back(self, reservation: Reservation) -> None:
        """Undo a reservation that will not run (refused later): every grant back, requests too."""
        self._give_back(
            [
                (self.tenant_requests, reservation.tenant_requests),
                (self.key_requests, reservation.key_requests),
                (self.tenant_tokens, reservation.tenant_tokens),
                (self.key_tokens, reservation.key_tokens),
            ]
        )

    def settle(self, reservation: Reservation, num_used: int) -> None:
        """Charge what the request used to both principals' token budgets (requests stay counted)."""
        self.tenant_tokens.settle(reservation.tenant_tokens, num_used)
        self.key_tokens.settle(reservation.key_tokens, num_used)

    async def start(self) -> None:
        """Begin every budget's background work (lease expiry)."""
        for budget in self._all():
            await budget.start()

    async def close(self) -> None:
        """Return every budget's unused leases."""
        for budget in self._all():
            await budget.close()
