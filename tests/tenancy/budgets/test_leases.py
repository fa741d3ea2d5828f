"""Budget leases on SQLite and PostgreSQL: atomic chunks, the cross-replica bound, expiry, returns."""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass

import pytest

from weir.tenancy.budgets.leases import LeasedBudget, LeaseStore
from weir.tenancy.budgets.quotas import SECONDS_PER_DAY, Denial, Grant, LimitKind
from weir.tenancy.context import QuotaLimits
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

START = 1_900_000_000.0


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


def _tenant(repo: TenancyRepo, limits: QuotaLimits, name: str = "acme") -> str:
    repo.create_tenant(TenantSpec(name=name, quota=limits), actor="test")
    return name


def _replica(db: Database, clock: Clock, **kwargs: float) -> LeasedBudget:
    return LeasedBudget(LeaseStore(db, clock), clock=clock, **kwargs)  # type: ignore[arg-type]


def test_replicas_together_never_exceed_the_daily_budget(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_day=10_000)
    tenant = _tenant(repo, limits)
    clock = Clock()
    replicas = [_replica(migrated, clock, lease_tokens=700) for _ in range(3)]
    rng = random.Random(7)

    async def run() -> int:
        admitted = 0
        for _ in range(120):
            replica = rng.choice(replicas)
            size = rng.randint(20, 400)
            result = await replica.take(tenant, limits, size)
            if isinstance(result, Grant):
                admitted += size
                if rng.random() < 0.3:  # settle some with real usage below the reservation
                    used = rng.randint(0, size)
                    replica.settle(result, used)
                    admitted -= size - used
            else:
                assert result.limit is LimitKind.TOKENS_PER_DAY
                assert result.retry_after_s is not None and result.retry_after_s > 0
        return admitted

    admitted = asyncio.run(run())
    chunk = replicas[0].chunk_for(limits)
    assert chunk == 700
    assert admitted <= 10_000
    # Little is stranded: at most one lease per replica plus one request's worth.
    assert admitted >= 10_000 - 3 * chunk - 400
    held = sum(r.held(tenant) for r in replicas)
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.day_remaining is not None
    assert state.day_remaining + held + admitted == 10_000

    async def close_all() -> None:
        for r in replicas:
            await r.close()

    asyncio.run(close_all())  # shutdown returns every unused balance
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.day_remaining == 10_000 - admitted


def test_concurrent_leases_are_atomic(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_minute=5_000)
    tenant = _tenant(repo, limits)
    clock = Clock()  # frozen: no refill during the race
    LeaseStore(migrated, clock).lease(tenant, limits, 1, 1)  # create the row first
    granted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        store = LeaseStore(Database(migrated.url), clock)
        mine = 0
        for _ in range(15):
            mine += store.lease(tenant, limits, 97, 97).granted
        store.db.dispose()
        with lock:
            granted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(granted) + 1
    assert total <= 5_000
    assert total > 5_000 - 97  # every chunk that fitted was granted to someone
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.tokens == pytest.approx(5_000 - total)


def test_the_bucket_refills_and_denials_say_when(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_minute=600)  # 10 tokens per second
    tenant = _tenant(repo, limits)
    clock = Clock()
    budget = _replica(migrated, clock, lease_tokens=1_000)
    assert budget.chunk_for(limits) == 75  # 1/8 of the limit

    async def run() -> None:
        assert isinstance(await budget.take(tenant, limits, 600), Grant)  # a whole minute at once
        denial = await budget.take(tenant, limits, 50)
        assert isinstance(denial, Denial) and denial.limit is LimitKind.TOKENS_PER_MINUTE
        assert denial.retry_after_s == pytest.approx(5.0)
        assert denial.limit_value == 600 and denial.remaining == 0
        clock.now += 5.0
        assert isinstance(await budget.take(tenant, limits, 50), Grant)
        too_large = await budget.take(tenant, limits, 601)
        assert isinstance(too_large, Denial) and too_large.retry_after_s is None

    asyncio.run(run())


def test_unused_leases_return_on_expiry(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_day=800)
    tenant = _tenant(repo, limits)
    clock = Clock()
    a = _replica(migrated, clock, lease_tokens=100, lease_ttl_s=10.0)
    b = _replica(migrated, clock, lease_tokens=100, lease_ttl_s=10.0)

    async def run() -> None:
        grant = await a.take(tenant, limits, 10)
        assert isinstance(grant, Grant) and a.held(tenant) == 90
        assert isinstance(await b.take(tenant, limits, 700), Grant)  # a's 90 are not available
        assert isinstance(await b.take(tenant, limits, 91), Denial)
        a.settle(grant, 0)  # live lease: back into a's balance
        assert a.held(tenant) == 100
        clock.now += 10.0
        await a.sweep()  # expired: a's balance goes back to the database
        assert a.held(tenant) == 0
        assert isinstance(await b.take(tenant, limits, 100), Grant)

    asyncio.run(run())
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.day_remaining == 0


def test_refunds_after_expiry_are_returned_to_the_database(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_day=1_000)
    tenant = _tenant(repo, limits)
    clock = Clock()
    budget = _replica(migrated, clock, lease_tokens=100, lease_ttl_s=5.0)

    async def run() -> None:
        grant = await budget.take(tenant, limits, 100)
        assert isinstance(grant, Grant)
        clock.now += 6.0  # the request outlived its lease
        budget.settle(grant, 40)
        assert budget.held(tenant) == 0
        await budget.sweep()

    asyncio.run(run())
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.day_remaining == 960


def test_a_new_day_starts_a_new_count(migrated: Database, repo: TenancyRepo) -> None:
    limits = QuotaLimits(tokens_per_day=100)
    tenant = _tenant(repo, limits)
    clock = Clock(now=(int(START // SECONDS_PER_DAY) + 1) * SECONDS_PER_DAY - 5)
    budget = _replica(migrated, clock, lease_tokens=100)

    async def run() -> None:
        assert isinstance(await budget.take(tenant, limits, 100), Grant)
        denial = await budget.take(tenant, limits, 1)
        assert isinstance(denial, Denial) and denial.retry_after_s == pytest.approx(5.0)
        clock.now += 6
        assert isinstance(await budget.take(tenant, limits, 100), Grant)

    asyncio.run(run())


def test_unlimited_tenants_never_touch_the_database(migrated: Database, repo: TenancyRepo) -> None:
    tenant = _tenant(repo, QuotaLimits())
    budget = _replica(migrated, Clock())
    grant = asyncio.run(budget.take(tenant, QuotaLimits(), 10**9))
    assert isinstance(grant, Grant) and grant.unlimited
    assert LeaseStore(migrated, Clock()).state(tenant, QuotaLimits()) is None


def test_overshoot_is_charged_from_the_balance_then_as_debt_in_the_database(
    migrated: Database, repo: TenancyRepo
) -> None:
    limits = QuotaLimits(tokens_per_minute=600, tokens_per_day=10_000)  # 10 tokens per second
    tenant = _tenant(repo, limits)
    clock = Clock()
    a = _replica(migrated, clock, lease_tokens=75, lease_ttl_s=10.0)
    b = _replica(migrated, clock, lease_tokens=75, lease_ttl_s=10.0)

    async def run() -> None:
        grant = await a.take(tenant, limits, 25)
        assert isinstance(grant, Grant) and a.held(tenant) == 50
        a.settle(grant, 25 + 30)  # 30 over: taken from a's live balance
        assert a.held(tenant) == 20
        a.settle(await a.take(tenant, limits, 20), 20 + 1_000)  # 1,000 over, nothing held: debt
        assert a.held(tenant) == 0
        # Until a flushes, the debt is only on a: b still leases from the shared bucket (600 - 150).
        assert isinstance(await b.take(tenant, limits, 10), Grant)
        # a flushes its debt before its next lease: the shared bucket is now in debt.
        denial = await a.take(tenant, limits, 10)
        assert isinstance(denial, Denial) and denial.limit is LimitKind.TOKENS_PER_MINUTE
        assert denial.retry_after_s == pytest.approx((1_000 - 450 + 10) / 10)  # the debt is waited out

    asyncio.run(run())
    state = LeaseStore(migrated, clock).state(tenant, limits)
    assert state is not None and state.tokens < 0
    assert state.day_remaining == 10_000 - (75 + 75 + 1_000)  # both leases and the debt
