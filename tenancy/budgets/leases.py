"""Token budgets shared by several replicas: each one leases chunks of a tenant's budget.

The budget lives in one `budget_buckets` row per tenant: the tokens-per-minute bucket's level and
the daily count. A replica that runs out of leased tokens takes a new chunk with one conditional
UPDATE that refills the bucket, checks `available >= chunk` (and the daily cap) and subtracts, all
in one statement; the database serializes concurrent updates of the row, so two replicas can never
both take the last chunk. Reservations are then served from the replica's local balance without
touching the database; refunds go back into the balance. A request that used more than it reserved
is charged the overshoot: from the balance while it lasts, the rest as debt in the database row
(its level goes below zero; the next lease waits until the refill has paid it off).

Bound: every admitted token was leased first and leases are only granted from what the bucket
holds, so replicas together admit at most the budget. A balance still held when the budget is
looked at is at most one lease per replica: that is the slack.

Unused balances return to the database when their lease expires (`lease_ttl_s`, and at the UTC
midnight that ends their day) and when the replica shuts down. A replica that crashes loses its
balance (at most one lease): the budget errs on the side of admitting less.

SQLite: budgets work the same way, but SQLite is a single-file, single-host database, so Weir
assumes one replica there (and `weir serve` uses the in-process `LocalBudget` with SQLite).
Clocks: times are the replicas' epoch seconds. A replica whose clock is behind never refills
(elapsed time is clamped at zero), so clock skew delays refills rather than adding tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol, cast

from sqlalchemy import ColumnElement, Executable, Table, case, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from weir.tenancy.budgets.quotas import (
    Clock,
    Denial,
    Grant,
    LimitKind,
    day_of,
    is_token_limited,
    make_denial,
    seconds_to_midnight,
)
from weir.tenancy.context import QuotaLimits
from weir.tenancy.store.db import Database
from weir.tenancy.store.models import BudgetBucket, PrincipalBucket, Tenant

logger = logging.getLogger(__name__)

UNLIMITED = 1e15  # stands in for a missing limit inside SQL (no NULL arithmetic)
LEASE_SHARE = 8  # a lease is at most 1/8 of the tenant's limit, so replicas share small budgets


@dataclass(frozen=True)
class BucketState:
    """A tenant's shared budget as the database holds it, refilled to `now`."""

    tokens: float  # tokens-per-minute tokens available (UNLIMITED without that limit)
    day_remaining: int | None  # None without a daily cap


@dataclass(frozen=True)
class LeaseResult:
    """What one lease attempt got: `granted` tokens counted on `day`, or the state that refused."""

    granted: int
    day: int
    state: BucketState | None = None
    level: float | None = None  # the shared bucket's level right after a grant (rate-limit headers)


class BucketRows(Protocol):
    """Which table holds a principal's bucket row, and how its row is found and created."""

    table: Table

    def where(self, name: str) -> ColumnElement[bool]:
        """The condition that picks `name`'s row."""
        ...

    def create(self, name: str, cap: float, now: float) -> Executable:
        """An INSERT of `name`'s row with a full bucket (a no-op when the principal is unknown)."""
        ...


class TenantTokenRows:
    """A tenant's token budget: its `budget_buckets` row, keyed by the tenant's integer id."""

    def __init__(self) -> None:
        self.table = cast(Table, BudgetBucket.__table__)

    def _pk(self, tenant: str) -> ColumnElement[int]:
        # A subquery rather than a cached id: a tenant deleted and created again gets a new id.
        return select(Tenant.id).where(Tenant.name == tenant).scalar_subquery()

    def where(self, name: str) -> ColumnElement[bool]:
        return self.table.c.tenant_id == self._pk(name)

    def create(self, name: str, cap: float, now: float) -> Executable:
        rows = select(Tenant.id, literal(cap), literal(now), literal(day_of(now)), literal(0)).where(
            Tenant.name == name
        )
        return insert(self.table).from_select(["tenant_id", "tokens", "refilled_at", "day", "day_used"], rows)


class SubjectRows:
    """Any other budget: a `principal_buckets` row named `<prefix><name>` (e.g. `key:<id>:tokens`)."""

    def __init__(self, prefix: str) -> None:
        self.table = cast(Table, PrincipalBucket.__table__)
        self.prefix = prefix

    def where(self, name: str) -> ColumnElement[bool]:
        return self.table.c.subject == self.prefix + name

    def create(self, name: str, cap: float, now: float) -> Executable:
        return insert(self.table).values(
            subject=self.prefix + name, tokens=cap, refilled_at=now, day=day_of(now), day_used=0
        )


class LeaseStore:
    """The database side: atomic conditional UPDATEs on one bucket row. Blocking; run in a thread.

    `rows` says which: a tenant's tokens (`budget_buckets`, the default) or another principal's
    budget (`principal_buckets`: a key's tokens, a tenant's or a key's requests).
    """

    def __init__(self, db: Database, clock: Clock = time.time, rows: BucketRows | None = None) -> None:
        self.db = db
        self.clock = clock
        self.rows: BucketRows = rows if rows is not None else TenantTokenRows()
        self._t = self.rows.table

    # -- SQL pieces ------------------------------------------------------------------------

    def _available(self, limits: QuotaLimits, now: float) -> ColumnElement[float]:
        t = self._t.c
        tpm = limits.tokens_per_minute
        cap = float(tpm) if tpm is not None else UNLIMITED
        rate = tpm / 60.0 if tpm is not None else 0.0
        elapsed = case((t.refilled_at < now, literal(now) - t.refilled_at), else_=0.0)
        refilled = t.tokens + elapsed * rate
        return case((refilled > cap, cap), else_=refilled)

    def _used_today(self, today: int) -> ColumnElement[int]:
        t = self._t.c
        # A row already on a later day (another replica's clock is ahead) keeps its count.
        return case((t.day >= today, t.day_used), else_=0)

    # -- operations ------------------------------------------------------------------------

    def _try_take(
        self, session: Session, tenant: str, limits: QuotaLimits, n: int, now: float
    ) -> float | None:
        """Take `n` tokens; the bucket's level after the take, or None when refused."""
        t = self._t.c
        today = day_of(now)
        available = self._available(limits, now)
        used = self._used_today(today)
        day_cap = float(limits.tokens_per_day) if limits.tokens_per_day is not None else UNLIMITED
        stmt = (
            update(self._t)
            .where(self.rows.where(tenant), available >= n, used + n <= day_cap)
            .values(
                tokens=available - n,
                refilled_at=case((t.refilled_at < now, now), else_=t.refilled_at),
                day=case((t.day >= today, t.day), else_=today),
                day_used=used + n,
            )
            .returning(t.tokens)
        )
        row = session.execute(stmt).first()
        return None if row is None else float(row[0])

    def _create(self, tenant: str, limits: QuotaLimits, now: float) -> None:
        """The tenant's row, starting with a full bucket; a concurrent creation wins harmlessly."""
        cap = float(limits.tokens_per_minute) if limits.tokens_per_minute is not None else UNLIMITED
        with contextlib.suppress(IntegrityError), self.db.transaction() as session:
            session.execute(self.rows.create(tenant, cap, now))

    def state(self, tenant: str, limits: QuotaLimits) -> BucketState | None:
        """The tenant's budget now, or None when it has no row (yet)."""
        now = self.clock()
        with self.db.transaction() as session:
            row = session.execute(
                select(self._available(limits, now), self._used_today(day_of(now))).where(
                    self.rows.where(tenant)
                )
            ).first()
        if row is None:
            return None
        tokens, used = float(row[0]), int(row[1])
        tpd = limits.tokens_per_day
        return BucketState(tokens, None if tpd is None else max(0, tpd - used))

    def lease(self, tenant: str, limits: QuotaLimits, want: int, need: int) -> LeaseResult:
        """Take `want` tokens, else at least `need`; on refusal, the state that refused."""
        now = self.clock()
        sizes = (want, need) if want > need else (need,)
        for attempt in range(2):
            with self.db.transaction() as session:
                for n in sizes:
                    level = self._try_take(session, tenant, limits, n, now)
                    if level is not None:
                        return LeaseResult(n, day_of(now), level=level)
            state = self.state(tenant, limits)
            if state is not None or attempt:
                return LeaseResult(0, day_of(now), state or BucketState(0.0, 0))
            self._create(tenant, limits, now)
        raise AssertionError("unreachable")

    def give_back(self, tenant: str, limits: QuotaLimits, tokens: int, day: int) -> None:
        """Return unused leased tokens: to the bucket (up to its capacity) and to `day`'s count.

        Negative `tokens` charge debt: the level may go below zero and `day`'s count above the cap.
        """
        if tokens == 0:
            return
        now = self.clock()
        t = self._t.c
        tpm = limits.tokens_per_minute
        cap = float(tpm) if tpm is not None else UNLIMITED
        refunded = self._available(limits, now) + tokens
        if tokens > 0:
            day_used = case(
                (t.day == day, case((t.day_used > tokens, t.day_used - tokens), else_=0)),
                else_=t.day_used,
            )
            row_day: ColumnElement[int] | int = t.day
        else:  # debt: counted on `day`, which starts afresh if the row is still on an older day
            day_used = case((t.day == day, t.day_used - tokens), (t.day < day, -tokens), else_=t.day_used)
            row_day = case((t.day < day, day), else_=t.day)
        stmt = (
            update(self._t)
            .where(self.rows.where(tenant))
            .values(
                tokens=case((refunded > cap, cap), else_=refunded),
                refilled_at=case((t.refilled_at < now, now), else_=t.refilled_at),
                day=row_day,
                day_used=day_used,
            )
        )
        with self.db.transaction() as session:
            session.execute(stmt)


@dataclass
class _Held:
    """One tenant's leased tokens on this replica."""

    limits: QuotaLimits
    balance: int = 0
    day: int = -1
    expires_at: float = 0.0
    returns: list[tuple[int, int]] = field(default_factory=list)  # (day, tokens) owed to the database
    shared_level: float = 0.0  # the shared bucket's level when this replica last leased
    shared_at: float = 0.0  # when that was
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class LeasedBudget:
    """A `TokenBudget` over a `LeaseStore`: leases in chunks, serves reservations locally.

    `lease_tokens` caps a chunk (a chunk is also at most 1/8 of the tenant's smallest limit and at
    least the request's own size). Database calls run in a worker thread; one tenant's lease
    requests are serialized, so a burst costs one round trip, not one per request.
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        lease_tokens: int = 4096,
        lease_ttl_s: float = 10.0,
        clock: Clock = time.time,
    ) -> None:
        if lease_tokens < 1:
            raise ValueError(f"lease_tokens must be >= 1, got {lease_tokens}")
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
        self.store = store
        self.lease_tokens = lease_tokens
        self.lease_ttl_s = lease_ttl_s
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def chunk_for(self, limits: QuotaLimits) -> int:
        """The usual lease size for a tenant."""
        smallest = min(limits.tokens_per_minute or UNLIMITED, limits.tokens_per_day or UNLIMITED)
        return max(1, min(self.lease_tokens, int(smallest) // LEASE_SHARE))

    def held(self, tenant_id: str) -> int:
        """Tokens leased and not yet reserved on this replica."""
        held = self._held.get(tenant_id)
        return held.balance if held is not None else 0

    async def take(self, tenant_id: str, limits: QuotaLimits, num_tokens: int) -> Grant | Denial:
        now = self.clock()
        if not is_token_limited(limits):
            return Grant(tenant_id, num_tokens, day_of(now), unlimited=True)
        too_large = _too_large(limits, num_tokens, now)
        if too_large is not None:
            return too_large
        held = self._held.get(tenant_id)
        if held is None:
            held = self._held[tenant_id] = _Held(limits)
        held.limits = limits
        async with held.lock:
            now = self.clock()
            if held.balance and (now >= held.expires_at or day_of(now) != held.day):
                await self._flush(tenant_id, held, balance=True)
            if held.balance >= num_tokens:
                held.balance -= num_tokens
                return self._grant(tenant_id, held, num_tokens, now)
            if held.returns:  # debt and refunds first, so the lease below sees them
                await self._flush(tenant_id, held, balance=False)
            need = num_tokens - held.balance
            want = max(need, self.chunk_for(limits))
            result = await asyncio.to_thread(self.store.lease, tenant_id, limits, want, need)
            if result.granted:
                if held.balance and result.day != held.day:  # midnight passed during the call
                    await self._flush(tenant_id, held, balance=True)
                held.balance += result.granted
                held.day = result.day
                now = self.clock()
                held.expires_at = now + min(self.lease_ttl_s, seconds_to_midnight(now))
                if result.level is not None:
                    held.shared_level, held.shared_at = result.level, now
                if held.balance >= num_tokens:
                    held.balance -= num_tokens
                    return self._grant(tenant_id, held, num_tokens, now)
                return _denial(limits, num_tokens, BucketState(0.0, 0), held.balance, now)
            return _denial(limits, need, result.state or BucketState(0.0, 0), held.balance, self.clock())

    def _grant(self, tenant_id: str, held: _Held, num_tokens: int, now: float) -> Grant:
        """A grant from the balance, with the estimated tokens-per-minute level for the headers."""
        tpm = held.limits.tokens_per_minute
        if tpm is None:
            return Grant(tenant_id, num_tokens, held.day)
        rate = tpm / 60.0
        shared = min(float(tpm), held.shared_level + max(0.0, now - held.shared_at) * rate)
        remaining = max(0.0, min(float(tpm), shared + held.balance))
        return Grant(
            tenant_id, num_tokens, held.day, remaining=int(remaining), reset_s=(tpm - remaining) / rate
        )

    def settle(self, grant: Grant, num_used: int) -> None:
        if grant.unlimited:
            return
        held = self._held.get(grant.tenant_id)
        if held is None:
            return
        now = self.clock()
        live = grant.day == held.day and now < held.expires_at
        num_used = max(0, num_used)
        if num_used < grant.num_tokens:
            refund = grant.num_tokens - num_used
            if live:
                held.balance += refund  # the lease is live: reuse the tokens here
            else:
                held.returns.append((grant.day, refund))
        elif num_used > grant.num_tokens:
            overshoot = num_used - grant.num_tokens
            if live:
                from_balance = min(overshoot, held.balance)
                held.balance -= from_balance
                overshoot -= from_balance
            if overshoot:
                held.returns.append((day_of(now), -overshoot))  # debt, sent before the next lease

    async def _flush(self, tenant_id: str, held: _Held, *, balance: bool) -> None:
        """Send what is owed to the database: refunds, and the unused balance if `balance`."""
        owed, held.returns = held.returns, []
        if balance and held.balance:
            owed.append((held.day, held.balance))
            held.balance = 0
        for i, (day, tokens) in enumerate(owed):
            try:
                await asyncio.to_thread(self.store.give_back, tenant_id, held.limits, tokens, day)
            except Exception:
                logger.exception("returning %d leased tokens of %s failed; retrying later", tokens, tenant_id)
                held.returns.extend(owed[i:])
                return

    async def sweep(self) -> None:
        """Return balances whose lease expired, and refunds owed to the database."""
        for tenant_id, held in list(self._held.items()):
            if held.lock.locked():
                continue  # a take is at work there; the next sweep will see it
            expired = held.balance > 0 and self.clock() >= held.expires_at
            if expired or held.returns:
                async with held.lock:
                    await self._flush(tenant_id, held, balance=self.clock() >= held.expires_at)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 2)
            try:
                await self.sweep()
            except Exception:
                logger.exception("lease sweep failed")

    async def start(self) -> None:
        """Start the background sweep that returns expired leases."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="weir-lease-sweep")

    async def close(self) -> None:
        """Stop sweeping and return every unused balance (shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for tenant_id, held in list(self._held.items()):
            async with held.lock:
                await self._flush(tenant_id, held, balance=True)


def _too_large(limits: QuotaLimits, num_tokens: int, now: float) -> Denial | None:
    """A request larger than a limit can never be admitted: say so without asking the database."""
    tpm, tpd = limits.tokens_per_minute, limits.tokens_per_day
    if tpm is not None and num_tokens > tpm:
        return make_denial(LimitKind.TOKENS_PER_MINUTE, tpm, 0, 60.0, None, num_tokens)
    if tpd is not None and num_tokens > tpd:
        return make_denial(LimitKind.TOKENS_PER_DAY, tpd, 0, seconds_to_midnight(now), None, num_tokens)
    return None


def _denial(limits: QuotaLimits, need: int, state: BucketState, balance: int, now: float) -> Denial:
    """Why the shared budget could not cover `need` more tokens, with the wait that would fix it."""
    tpm = limits.tokens_per_minute
    if tpm is not None and state.tokens < need:
        rate = tpm / 60.0
        return make_denial(
            LimitKind.TOKENS_PER_MINUTE,
            tpm,
            int(state.tokens) + balance,
            (tpm - state.tokens) / rate,
            (need - state.tokens) / rate,
            need + balance,
        )
    remaining = state.day_remaining if state.day_remaining is not None else 0
    return make_denial(
        LimitKind.TOKENS_PER_DAY,
        limits.tokens_per_day or 0,
        remaining + balance,
        seconds_to_midnight(now),
        seconds_to_midnight(now),
        need + balance,
    )
