"""Window budgets on the database: hard limits refuse with the time to wait, soft limits alert
once, settlement refunds and charges overshoot, and concurrent takes (separate connections, as
replicas) admit exactly what fits (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from weir.engine.request import Priority
from weir.tenancy.budgets.budget_windows import WindowKind, WindowSpec
from weir.tenancy.budgets.window_budget_records import BudgetSpec, BudgetUnit, window_spec
from weir.tenancy.budgets.window_budgets import WindowBudgetStore
from weir.tenancy.errors import FieldError, KeyNotFoundError, TenantNotFoundError
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction, UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn

# 2030-01-01 12:00 UTC
T = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC).timestamp()
DAY = WindowSpec(WindowKind.DAY)


class Clock:
    def __init__(self, now: float = T) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def key(repo: TenancyRepo) -> str:
    repo.create_tenant(TenantSpec("acme", Priority.STANDARD, 1.0), actor="test")
    return repo.issue_key("acme", KeySpec(), actor="test").view.id


def _store(db: Database, clock: Clock) -> WindowBudgetStore:
    return WindowBudgetStore(db, clock=clock)


def test_a_hard_limit_refuses_until_the_window_resets(
    migrated: Database, repo: TenancyRepo, key: str
) -> None:
    clock = Clock()
    store = _store(migrated, clock)
    budget = store.set_budget(BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, hard_limit=100), actor="a")
    assert not store.take([(budget, 60)]).refusal
    result = store.take([(budget, 41)])
    assert result.refusal is not None and result.charges == ()
    assert result.refusal.used == 60 and result.refusal.requested == 41
    assert result.refusal.retry_after_s == 12 * 3600  # until midnight UTC
    assert store.take([(budget, 40)]).refusal is None  # exactly up to the limit
    too_big = store.take([(budget, 101)]).refusal
    assert too_big is not None and too_big.retry_after_s is None
    clock.now += 12 * 3600  # the next day
    assert store.used(budget) == 0
    assert store.take([(budget, 100)]).refusal is None


def test_a_rolling_window_frees_what_leaves_it(migrated: Database, repo: TenancyRepo, key: str) -> None:
    clock = Clock()
    store = _store(migrated, clock)
    spec = WindowSpec(WindowKind.ROLLING, rolling_s=3600)  # buckets of 60 s
    budget = store.set_budget(BudgetSpec("acme", None, BudgetUnit.MICROS, spec, hard_limit=100), actor="a")
    store.take([(budget, 30)])
    clock.now += 600
    store.take([(budget, 70)])
    refusal = store.take([(budget, 20)]).refusal
    assert refusal is not None
    assert refusal.retry_after_s == 3000  # the first 30 leave the window at T + 3600
    clock.now += 3000
    assert store.used(budget) == 70
    assert store.take([(budget, 30)]).refusal is None


def test_all_or_nothing_across_tenant_and_key(migrated: Database, repo: TenancyRepo, key: str) -> None:
    store = _store(migrated, Clock())
    tenant_budget = store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, hard_limit=1000), actor="a"
    )
    key_budget = store.set_budget(BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, hard_limit=50), actor="a")
    result = store.take([(tenant_budget, 60), (key_budget, 60)])
    assert result.refusal is not None and result.refusal.budget == key_budget  # the key is narrower
    assert store.used(tenant_budget) == 0  # nothing was taken from the tenant either
    wide = store.set_budget(BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, hard_limit=5000), actor="a")
    assert wide.id == key_budget.id  # same principal, unit and window: the limits change
    narrow_tenant = store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, hard_limit=10), actor="a"
    )
    result = store.take([(narrow_tenant, 60), (wide, 60)])
    assert result.refusal is not None and result.refusal.budget.key_id is None  # now the tenant is


def test_soft_limit_alerts_once_per_window_on_real_use(
    migrated: Database, repo: TenancyRepo, key: str
) -> None:
    clock = Clock()
    store = _store(migrated, clock)
    budget = store.set_budget(
        BudgetSpec("acme", key, BudgetUnit.MICROS, DAY, soft_limit=100, hard_limit=None), actor="a"
    )
    big = store.take([(budget, 500)])  # a reservation past the soft limit is not an alert ...
    assert big.refusal is None
    assert store.settle(big.charges, [99]) == ()  # ... its real use, under it, is none either
    crossed = store.take([(budget, 50)])
    assert [a.used for a in store.settle(crossed.charges, [5])] == [104]
    again = store.take([(budget, 50)])
    assert store.settle(again.charges, [50]) == ()  # already alerted in this window
    clock.now += 86_400  # the next day: a new window may alert again
    tomorrow = store.take([(budget, 150)])
    assert [a.used for a in store.settle(tomorrow.charges, [150])] == [150]
    events = [e for e in repo.list_audit(limit=20) if e.action == AuditAction.BUDGET_SOFT_LIMIT]
    assert len(events) == 2 and events[-1].target == key and events[-1].details["used"] == 104


def test_settlement_refunds_and_charges_overshoot(migrated: Database, repo: TenancyRepo, key: str) -> None:
    store = _store(migrated, Clock())
    budget = store.set_budget(
        BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, soft_limit=90, hard_limit=100), actor="a"
    )
    first = store.take([(budget, 80)])
    store.settle(first.charges, [30])
    assert store.used(budget) == 30
    second = store.take([(budget, 50)])
    alerts = store.settle(second.charges, [65])  # used more than reserved: 95, past the soft limit
    assert store.used(budget) == 95 and [a.used for a in alerts] == [95]


def test_admin_validation_and_audit(migrated: Database, repo: TenancyRepo, key: str) -> None:
    store = _store(migrated, Clock())
    with pytest.raises(TenantNotFoundError):
        store.set_budget(BudgetSpec("nobody", None, BudgetUnit.TOKENS, DAY, hard_limit=1), actor="a")
    with pytest.raises(KeyNotFoundError):
        store.set_budget(BudgetSpec("acme", "nokey", BudgetUnit.TOKENS, DAY, hard_limit=1), actor="a")
    for kwargs, field in [
        ({"soft_limit": None, "hard_limit": None}, "hard_limit"),
        ({"soft_limit": 5, "hard_limit": 4}, "soft_limit"),
        ({"hard_limit": 0}, "hard_limit"),
        ({"hard_limit": True}, "hard_limit"),
    ]:
        with pytest.raises(FieldError) as caught:
            BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field
    for args, field in [
        (("fortnight",), "window"),
        (("day", "Mars/Base"), "time_zone"),
        (("rolling", "UTC", 61), "rolling_s"),
    ]:
        with pytest.raises(FieldError) as caught:
            window_spec(*args)  # type: ignore[arg-type]
        assert caught.value.field == field
    budget = store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.MICROS, window_spec("month", "Europe/Paris"), hard_limit=10**6),
        actor="admin-api 127.0.0.1",
    )
    assert store.list_budgets("acme") == [budget] and store.list_budgets("other") == []
    store.delete_budget(budget.id, actor="cli")
    assert store.list_budgets() == []
    actions = [e.action for e in repo.list_audit(limit=2)]
    assert actions == [AuditAction.BUDGET_DELETE, AuditAction.BUDGET_SET]
    with pytest.raises(FieldError):
        store.delete_budget(budget.id, actor="cli")


@pytest.mark.parametrize("unit", [BudgetUnit.TOKENS, BudgetUnit.MICROS])
def test_concurrent_takes_admit_exactly_what_fits(
    migrated: Database, repo: TenancyRepo, key: str, unit: BudgetUnit
) -> None:
    """N threads, each with its own connection pool (as replicas), race for a key's budget: exactly
    limit // amount takes succeed, and the count never passes the limit."""
    clock = Clock()
    budget = _store(migrated, clock).set_budget(
        BudgetSpec("acme", key, unit, DAY, hard_limit=1000), actor="a"
    )
    admitted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        db = Database(migrated.url)
        store = WindowBudgetStore(db, clock=clock, timeout_s=30.0)
        mine = 0
        for _ in range(10):
            mine += store.take([(budget, 37)]).refusal is None
        db.dispose()
        with lock:
            admitted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 1000 // 37
    assert _store(migrated, clock).used(budget) == 37 * (1000 // 37)


def test_concurrent_takes_across_tenant_and_two_keys_hold_every_limit(
    migrated: Database, repo: TenancyRepo, key: str
) -> None:
    """Two keys of one tenant race (each take locks the tenant's and its key's rows, in id order:
    no deadlock): the key's limit and the tenant's both hold, and the tenant fills exactly."""
    clock = Clock()
    other = repo.issue_key("acme", KeySpec(), actor="test").view.id
    setup = _store(migrated, clock)
    tenant_budget = setup.set_budget(
        BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, hard_limit=1000), actor="a"
    )
    narrow = setup.set_budget(BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, hard_limit=500), actor="a")
    wide = setup.set_budget(BudgetSpec("acme", other, BudgetUnit.TOKENS, DAY, hard_limit=10**6), actor="a")
    admitted = {narrow.id: 0, wide.id: 0}
    lock = threading.Lock()

    def worker(key_budget_id: int) -> None:
        db = Database(migrated.url)
        store = WindowBudgetStore(db, clock=clock, timeout_s=30.0)
        key_budget = narrow if key_budget_id == narrow.id else wide
        mine = 0
        for _ in range(10):
            mine += store.take([(tenant_budget, 37), (key_budget, 37)]).refusal is None
        db.dispose()
        with lock:
            admitted[key_budget_id] += mine

    threads = [threading.Thread(target=worker, args=(b.id,)) for b in (narrow, wide) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admitted[narrow.id] <= 500 // 37
    assert admitted[narrow.id] + admitted[wide.id] == 1000 // 37  # the wide key's 30 tries fill the tenant
    assert setup.used(tenant_budget) == 37 * (1000 // 37)
    assert setup.used(narrow) == 37 * admitted[narrow.id]


def _served(repo: TenancyRepo, request_id: str, t: float, tokens: int, key: str | None) -> None:
    repo.record_usage(
        UsageRecordIn(
            request_id, "acme", key, "m", UsageStatus.COMPLETED, tokens - 1, 1,
            created_at=dt.datetime.fromtimestamp(t, dt.UTC),
        )
    )  # fmt: skip


def test_a_new_budget_counts_what_was_served_in_its_window_before_it(
    migrated: Database, repo: TenancyRepo, key: str
) -> None:
    """Issue 54: `used` is never below what was served in the window, budget or not."""
    clock = Clock()
    store = _store(migrated, clock)
    other = repo.issue_key("acme", KeySpec(), actor="t").view.id
    _served(repo, "a", T - 10, 5, key)  # this minute's bucket of a rolling hour
    _served(repo, "b", T - 1800, 7, key)  # half an hour ago: its own bucket
    _served(repo, "c", T - 4000, 11, key)  # before the rolling hour, but today
    _served(repo, "d", T - 13 * 3600, 13, key)  # yesterday
    _served(repo, "e", T - 20, 17, other)  # the tenant's other key
    rolling = WindowSpec(WindowKind.ROLLING, rolling_s=3600)
    tenant_hour = store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.TOKENS, rolling, hard_limit=100), actor="a"
    )
    key_day = store.set_budget(BudgetSpec("acme", key, BudgetUnit.TOKENS, DAY, hard_limit=100), actor="a")
    money = store.set_budget(BudgetSpec("acme", key, BudgetUnit.MICROS, DAY, soft_limit=1), actor="a")
    assert store.used(tenant_hour) == 5 + 7 + 17
    assert store.used(key_day) == 5 + 7 + 11
    assert store.used(money) == 0  # no price: the records carry no spend
    # Counted in the buckets they were served in: they leave a rolling window one by one.
    assert store.used(tenant_hour, T + 1800 - 60) == 5 + 7 + 17
    assert store.used(tenant_hour, T + 1800) == 5 + 17
    # Changing a budget's limits counts nothing twice; the seeded use refuses like any other.
    again = store.set_budget(BudgetSpec("acme", None, BudgetUnit.TOKENS, rolling, hard_limit=40), actor="a")
    assert again.id == tenant_hour.id and store.used(again) == 29
    refusal = store.take([(again, 12)]).refusal
    assert refusal is not None and refusal.used == 29
    assert store.take([(again, 11)]).refusal is None
