"""Token budgets of one replica: tokens-per-minute buckets, daily caps and concurrency caps.

Admission reserves `prompt + max_tokens` tokens before a request runs; settlement charges what the
request used: it gives back what was not used, and charges what was used beyond the reservation
as debt (the bucket's level goes below zero, so the tenant's next admissions wait until it is
refilled; overshoot is never lost). A tenant's tokens-per-minute limit is a token bucket holding at most one
minute of tokens and refilling continuously; the daily limit counts tokens per UTC day. Plain
Python, no torch and no I/O: the clock is injected, so tests and hypothesis properties run on
simulated time. `weir.tenancy.budgets.leases` implements the same `TokenBudget` protocol over a shared
database for several replicas; `LocalBudget` here is the single-replica budget.

The clock returns epoch seconds (time.time): the daily cap needs calendar days, and one clock
for both keeps them consistent. A clock stepping backwards refills nothing (elapsed time is
clamped at zero) rather than taking tokens away.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from weir.tenancy.context import QuotaLimits

Clock = Callable[[], float]  # epoch seconds

SECONDS_PER_DAY = 86_400


def day_of(now: float) -> int:
    """The UTC day number (days since the epoch) of an epoch time."""
    return int(now // SECONDS_PER_DAY)


def seconds_to_midnight(now: float) -> float:
    """Seconds until the next UTC midnight, when the daily counter starts again."""
    return (day_of(now) + 1) * SECONDS_PER_DAY - now


class LimitKind(enum.Enum):
    """Which limit refused a request; the value names the quota field."""

    TOKENS_PER_MINUTE = "tokens_per_minute"
    TOKENS_PER_DAY = "tokens_per_day"
    MAX_CONCURRENT = "max_concurrent"
    REQUESTS_PER_MINUTE = "requests_per_minute"


@dataclass(frozen=True)
class Grant:
    """Tokens taken from a tenant's budget for one request; settlement returns the unused part.

    `day` is the UTC day the tokens were counted against, so a refund after midnight does not
    lower the new day's count. `unlimited` grants took nothing and give nothing back.
    """

    tenant_id: str
    num_tokens: int
    day: int
    unlimited: bool = False
    # The tokens-per-minute bucket after the take, for the `x-ratelimit-*` headers (None: no such
    # limit): tokens left, and seconds until it is full again. Exact for `LocalBudget`; an
    # estimate for `LeasedBudget` (the shared level when last leased, refilled since, plus the
    # replica's balance).
    remaining: int | None = None
    reset_s: float = 0.0


@dataclass(frozen=True)
class Denial:
    """Why a reservation was refused, with what the 429 headers report.

    `retry_after_s` None means waiting cannot help: the request is larger than the limit itself.
    """

    limit: LimitKind
    limit_value: int  # the tenant's limit (tokens, or requests for MAX_CONCURRENT)
    remaining: int  # tokens (or request slots) available now; negative: debt (overshoot) still owed
    reset_s: float  # seconds until the limit is back to its full value
    retry_after_s: float | None
    message: str

    @property
    def request_too_large(self) -> bool:
        return self.retry_after_s is None


class TokenBucket:
    """`capacity` tokens at most, refilled at `refill_per_s`.

    `try_take` only takes what is there; `charge` may take the level below zero (debt, from a
    request that used more than it reserved), which later reservations wait out.
    """

    def __init__(self, capacity: float, refill_per_s: float, now: float) -> None:
        if capacity <= 0 or refill_per_s < 0:
            raise ValueError(f"capacity must be > 0 and refill_per_s >= 0, got {capacity}, {refill_per_s}")
        self.capacity = capacity
        self.refill_per_s = refill_per_s
        self._level = capacity  # a new tenant starts with a full minute
        self._updated_s = now

    def level(self, now: float) -> float:
        """Tokens available at `now` (refills lazily)."""
        elapsed = max(0.0, now - self._updated_s)
        self._level = min(self.capacity, self._level + elapsed * self.refill_per_s)
        self._updated_s = max(self._updated_s, now)
        return self._level

    def try_take(self, num_tokens: int, now: float) -> bool:
        """Take `num_tokens` if that many are available; all or nothing."""
        if self.level(now) < num_tokens:
            return False
        self._level -= num_tokens
        return True

    def give(self, num_tokens: float, now: float) -> None:
        """Return tokens (a refund); the bucket never holds more than its capacity."""
        self._level = min(self.capacity, self.level(now) + max(0.0, num_tokens))

    def charge(self, num_tokens: float, now: float) -> None:
        """Take tokens whether or not they are there (overshoot): the level may go negative."""
        self._level = self.level(now) - max(0.0, num_tokens)

    def seconds_until(self, num_tokens: float, now: float) -> float | None:
        """How long until `num_tokens` are available; None if they never can be."""
        if num_tokens > self.capacity:
            return None
        deficit = num_tokens - self.level(now)
        if deficit <= 0:
            return 0.0
        return math.inf if self.refill_per_s == 0 else deficit / self.refill_per_s

    def seconds_until_full(self, now: float) -> float:
        return self.seconds_until(self.capacity, now) or 0.0

    def reconfigure(self, capacity: float, refill_per_s: float, now: float) -> None:
        """Apply a changed limit; the level is kept, clipped to the new capacity."""
        level = self.level(now)
        self.capacity, self.refill_per_s = capacity, refill_per_s
        self._level = min(level, capacity)


class DayCounter:
    """Tokens counted against a daily cap; starts again at each UTC midnight."""

    def __init__(self, cap: int, now: float) -> None:
        if cap < 0:
            raise ValueError(f"cap must be >= 0, got {cap}")
        self.cap = cap
        self.day = day_of(now)
        self.used = 0

    def _roll(self, now: float) -> None:
        today = day_of(now)
        if today > self.day:
            self.day, self.used = today, 0

    def remaining(self, now: float) -> int:
        self._roll(now)
        return max(0, self.cap - self.used)

    def try_take(self, num_tokens: int, now: float) -> bool:
        if self.remaining(now) < num_tokens:
            return False
        self.used += num_tokens
        return True

    def give(self, num_tokens: int, day: int, now: float) -> None:
        """Refund tokens counted on `day`; refunds to a day already over are dropped."""
        self._roll(now)
        if day == self.day:
            self.used = max(0, self.used - num_tokens)

    def charge(self, num_tokens: int, now: float) -> None:
        """Count tokens used beyond a reservation, today, even past the cap (debt)."""
        self._roll(now)
        self.used += max(0, num_tokens)


def is_token_limited(limits: QuotaLimits) -> bool:
    """Whether the tenant has any token limit at all (else reservations are free)."""
    return limits.tokens_per_minute is not None or limits.tokens_per_day is not None


class TenantAllowance:
    """One tenant's bucket and daily counter, following the tenant's current limits."""

    def __init__(self, limits: QuotaLimits, now: float) -> None:
        self.limits = limits
        self.bucket: TokenBucket | None = None
        self.daily: DayCounter | None = None
        self.update(limits, now)

    def update(self, limits: QuotaLimits, now: float) -> None:
        """Follow a quota change (the auth cache hands us the tenant's current limits)."""
        # Limits are >= 1 (weir.tenancy.repository.records validates them); None means unlimited.
        tpm, tpd = limits.tokens_per_minute, limits.tokens_per_day
        if tpm is None:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = TokenBucket(tpm, tpm / 60.0, now)
        elif self.bucket.capacity != tpm:
            self.bucket.reconfigure(tpm, tpm / 60.0, now)
        if tpd is None:
            self.daily = None
        elif self.daily is None:
            self.daily = DayCounter(tpd, now)
        else:
            self.daily.cap = tpd
        self.limits = limits

    def try_take(self, tenant_id: str, num_tokens: int, now: float) -> Grant | Denial:
        """Take from both the bucket and the daily counter, or from neither."""
        bucket, daily = self.bucket, self.daily
        if bucket is not None:
            wait = bucket.seconds_until(num_tokens, now)
            if wait is None or wait > 0:
                return self.denial(LimitKind.TOKENS_PER_MINUTE, num_tokens, now, wait)
        if daily is not None and daily.remaining(now) < num_tokens:
            wait_day = None if num_tokens > daily.cap else seconds_to_midnight(now)
            return self.denial(LimitKind.TOKENS_PER_DAY, num_tokens, now, wait_day)
        if bucket is not None:
            bucket.try_take(num_tokens, now)
        if daily is not None:
            daily.try_take(num_tokens, now)
        if bucket is None:
            return Grant(tenant_id, num_tokens, day_of(now))
        remaining = math.floor(bucket.level(now))
        return Grant(
            tenant_id, num_tokens, day_of(now), remaining=remaining, reset_s=bucket.seconds_until_full(now)
        )

    def settle(self, grant: Grant, num_used: int, now: float) -> None:
        """Charge `num_used` for `grant`: refund the unused part, or charge the overshoot as debt."""
        num_used = max(0, num_used)
        if num_used < grant.num_tokens:
            refund = grant.num_tokens - num_used
            if self.bucket is not None:
                self.bucket.give(refund, now)
            if self.daily is not None:
                self.daily.give(refund, grant.day, now)
        elif num_used > grant.num_tokens:
            overshoot = num_used - grant.num_tokens
            if self.bucket is not None:
                self.bucket.charge(overshoot, now)
            if self.daily is not None:
                self.daily.charge(overshoot, now)

    def denial(self, kind: LimitKind, num_tokens: int, now: float, retry_after_s: float | None) -> Denial:
        if kind is LimitKind.TOKENS_PER_MINUTE and self.bucket is not None:
            limit = self.limits.tokens_per_minute or 0
            remaining = int(self.bucket.level(now))
            reset = self.bucket.seconds_until_full(now)
        else:
            limit = self.limits.tokens_per_day or 0
            remaining = self.daily.remaining(now) if self.daily is not None else 0
            reset = seconds_to_midnight(now)
        return make_denial(kind, limit, remaining, reset, retry_after_s, num_tokens)


def make_denial(
    kind: LimitKind, limit: int, remaining: int, reset_s: float, retry_after_s: float | None, requested: int
) -> Denial:
    """A Denial with an OpenAI-like message."""
    per = "minute" if kind is LimitKind.TOKENS_PER_MINUTE else "day"
    if retry_after_s is None:
        message = (
            f"Request too large: it may use {requested} tokens (prompt + max_tokens) and the limit is "
            f"{limit} tokens per {per}. Reduce the prompt or max_tokens."
        )
    else:
        owed = (
            f" ({-remaining} owed by earlier requests that used more than they reserved)"
            if remaining < 0
            else ""
        )
        message = (
            f"Rate limit reached: tokens per {per}. Limit {limit}, remaining {max(0, remaining)}{owed}, "
            f"requested {requested}. Please try again in {retry_after_s:.1f}s."
        )
    return Denial(kind, limit, remaining, reset_s, retry_after_s, message)


class TokenBudget(Protocol):
    """Where a replica takes tokens from: its own buckets, or leases from a shared database."""

    async def take(self, tenant_id: str, limits: QuotaLimits, num_tokens: int) -> Grant | Denial:
        """Reserve `num_tokens` for one request, or say why not."""
        ...

    def settle(self, grant: Grant, num_used: int) -> None:
        """Settle a grant with what the request used (refund or debt). Never blocks; never raises."""
        ...

    async def start(self) -> None:
        """Begin background work (lease expiry), if any."""
        ...

    async def close(self) -> None:
        """Return what is held (unused leases) and release resources."""
        ...


class LocalBudget:
    """Token budgets kept in this process: exact for one replica (SQLite deployments).

    State is lost on restart, so a restarted replica starts every tenant with a full bucket and
    an empty daily count.
    """

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self._tenants: dict[str, TenantAllowance] = {}

    def allowance(self, tenant_id: str, limits: QuotaLimits) -> TenantAllowance:
        """The tenant's allowance, created or updated to `limits`."""
        now = self.clock()
        allowance = self._tenants.get(tenant_id)
        if allowance is None:
            allowance = self._tenants[tenant_id] = TenantAllowance(limits, now)
        elif allowance.limits != limits:
            allowance.update(limits, now)
        return allowance

    def try_take(self, tenant_id: str, limits: QuotaLimits, num_tokens: int) -> Grant | Denial:
        """The synchronous core of `take`."""
        if not is_token_limited(limits):
            return Grant(tenant_id, num_tokens, day_of(self.clock()), unlimited=True)
        return self.allowance(tenant_id, limits).try_take(tenant_id, num_tokens, self.clock())

    async def take(self, tenant_id: str, limits: QuotaLimits, num_tokens: int) -> Grant | Denial:
        return self.try_take(tenant_id, limits, num_tokens)

    def settle(self, grant: Grant, num_used: int) -> None:
        if grant.unlimited:
            return
        allowance = self._tenants.get(grant.tenant_id)
        if allowance is not None:
            allowance.settle(grant, num_used, self.clock())

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class ConcurrencyLimiter:
    """Requests in flight per tenant, capped by `max_concurrent` (per replica)."""

    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}

    def in_flight(self, tenant_id: str) -> int:
        return self._in_flight.get(tenant_id, 0)

    def try_acquire(self, tenant_id: str, limits: QuotaLimits) -> Denial | None:
        """Count one more request in flight, or a Denial when the tenant is at its cap."""
        n = self._in_flight.get(tenant_id, 0)
        cap = limits.max_concurrent
        if cap is not None and n >= cap:
            return Denial(
                LimitKind.MAX_CONCURRENT,
                cap,
                0,
                1.0,
                1.0,
                f"Too many concurrent requests: this API key allows {cap} at a time.",
            )
        self._in_flight[tenant_id] = n + 1
        return None

    def release(self, tenant_id: str) -> None:
        n = self._in_flight.get(tenant_id, 0) - 1
        if n > 0:
            self._in_flight[tenant_id] = n
        else:
            self._in_flight.pop(tenant_id, None)
