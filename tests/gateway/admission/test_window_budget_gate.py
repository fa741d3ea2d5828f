"""Admission with window budgets: a tenant's or key's hard limit refuses (429 + Retry-After, or
400 when too large) and gives back the per-minute grants; soft limits count an alert and serve;
settlement charges the real tokens or the spend at the serving version's price."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.gateway.admission_doubles import START, Clock, record, request, stats
from weir.engine.request import Priority
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController
from weir.gateway.admission.window_budget_gate import WindowBudgetGate, WindowBudgetMetrics
from weir.gateway.http.errors import BadRequestError, RateLimitError
from weir.migrations.migrate import upgrade
from weir.tenancy.budgets.budget_windows import WindowKind, WindowSpec
from weir.tenancy.budgets.money import TokenPrices
from weir.tenancy.budgets.prices import PriceRepo, PriceSpec
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.budgets.window_budget_records import BudgetSpec, BudgetUnit
from weir.tenancy.budgets.window_budgets import WindowBudgetStore
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

DAY = WindowSpec(WindowKind.DAY)
MONTH_PARIS = WindowSpec(WindowKind.MONTH, "Europe/Paris")


class Env:
    def __init__(self, db: Database) -> None:
        self.clock = Clock()
        self.repo = TenancyRepo(db, KeyHasher(b"p"))
        self.repo.create_tenant(TenantSpec("acme", Priority.STANDARD, 1.0), actor="t")
        self.key = self.repo.issue_key("acme", KeySpec(), actor="t").view.id
        self.store = WindowBudgetStore(db, clock=self.clock)
        now = dt.datetime.fromtimestamp(START - 60, dt.UTC)
        self.prices = PriceRepo(db, clock=lambda: now)
        self.registry = CollectorRegistry()
        self.gate = WindowBudgetGate(
            self.store, self.prices, WindowBudgetMetrics(self.registry), refresh_s=0.0, clock=self.clock
        )
        self.budget = LocalBudget(self.clock)
        self.controller = AdmissionController(
            lambda: stats(),
            self.budget,
            AdmissionConfig(max_queue_time_s=None, max_queued_tokens=None),
            window_budgets=self.gate,
        )

    def context(self, **quota: Any) -> TenantContext:
        return TenantContext("acme", self.key, Priority.STANDARD, 1.0, "acme", QuotaLimits(**quota))

    def sample(self, name: str) -> float:
        return sum(s.value for f in self.registry.collect() for s in f.samples if s.name == name)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    upgrade(db.engine)
    e = Env(db)
    yield e
    e.gate.close()
    db.dispose()


def test_a_key_token_budget_refuses_with_retry_after_and_gives_back(env: Env) -> None:
    env.store.set_budget(BudgetSpec("acme", env.key, BudgetUnit.TOKENS, DAY, hard_limit=100), actor="t")
    ctx = env.context(requests_per_minute=2)
    admitted = asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=50)]))  # reserves 60
    with pytest.raises(BadRequestError):  # more than the whole budget: waiting cannot help
        asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=500)]))
    with pytest.raises(RateLimitError) as caught:
        asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=50)]))
    headers = caught.value.headers
    seconds_to_midnight = 86_400 - START % 86_400
    assert int(headers["retry-after"]) == int(seconds_to_midnight) + (seconds_to_midnight % 1 > 0)
    assert "tokens per day (UTC) for this API key" in caught.value.message
    assert caught.value.code == "budget_exceeded"
    # The refused requests hold no concurrency slot and count against no per-minute limit: the
    # tenant's second request of this minute (of 2) is admitted, and a third is not.
    assert env.controller.concurrency.in_flight("acme") == 1
    second = asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=20)]))  # 30 of the 40 left
    with pytest.raises(RateLimitError) as caught:
        asyncio.run(env.controller(ctx, [request(prompt_len=1, max_tokens=1)]))
    assert "requests per minute" in caught.value.message
    second.settle(record(ctx, 10, 20))
    admitted.settle(record(ctx, 10, 20))  # used 30 of its 60
    env.gate.flush()
    budget = env.store.list_budgets()[0]
    assert env.store.used(budget) == 60


def test_a_tenant_money_budget_charges_the_spend_at_the_version_price(env: Env) -> None:
    env.prices.set_price(
        PriceSpec("m", "USD", TokenPrices(1_000_000, 0, 2_000_000)), actor="t"
    )  # $1, $2 per M
    budget = env.store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.MICROS, MONTH_PARIS, soft_limit=500, hard_limit=700), actor="t"
    )
    ctx = env.context()
    # Reserves the most it may spend: 100 prompt * 1 + 200 output * 2 = 500 micro-dollars.
    admitted = asyncio.run(env.controller(ctx, [request(prompt_len=100, max_tokens=200)]))
    assert env.store.used(budget) == 500
    admitted.settle(record(ctx, 100, 50, model="m", model_version="m@v1"))  # spent 100 + 100 = 200
    env.gate.flush()
    assert env.store.used(budget) == 200
    assert env.sample("weir_budget_soft_limit_alerts_total") == 0  # the reservation is no alert
    again = asyncio.run(env.controller(ctx, [request(prompt_len=100, max_tokens=200)]))
    again.settle(record(ctx, 100, 150, model="m", model_version="m@v1"))  # 100 + 300: 600 in all
    env.gate.flush()
    assert env.store.used(budget) == 600
    assert env.sample("weir_budget_soft_limit_alerts_total") == 1


def test_without_budgets_nothing_is_read_per_request(env: Env) -> None:
    ctx = env.context()
    for _ in range(3):
        asyncio.run(env.controller(ctx, [request()])).settle(record(ctx, 10, 5))
    assert env.gate.budgets_of(ctx) == ()


def test_requests_a_budget_did_not_see_at_admission_count_when_they_settle(env: Env) -> None:
    """Issue 54: a budget set (elsewhere) while requests run, or before this replica re-read its
    budgets, still counts them once they settle, in the bucket of their arrival."""
    env.gate.refresh_s = 3600.0  # no periodic re-read during the test
    ctx = env.context()
    running = asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=50)]))  # reads: none
    tenant_day = env.store.set_budget(
        BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, hard_limit=100), actor="t"
    )
    key_day = env.store.set_budget(
        BudgetSpec("acme", env.key, BudgetUnit.TOKENS, DAY, soft_limit=1), actor="t"
    )
    stale = asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=95)]))  # not read yet
    asyncio.run(env.gate.refresh_now())  # what the admin API awaits after a change on this replica
    running.settle(record(ctx, 10, 20, key_id=env.key))
    stale.settle(record(ctx, 10, 40, key_id=env.key))
    env.gate.flush()
    assert env.store.used(tenant_day) == env.store.used(key_day) == 30 + 50
    with pytest.raises(RateLimitError):  # 25 more do not fit the 20 left
        asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=15)]))
    charged = asyncio.run(env.controller(ctx, [request(prompt_len=10, max_tokens=10)]))
    assert env.store.used(tenant_day) == 100  # its reservation, taken at admission
    charged.settle(record(ctx, 10, 5, key_id=env.key))  # charged once: its reservation settled
    env.gate.flush()
    assert env.store.used(tenant_day) == 95 and env.store.used(key_day) == 95


def test_an_admin_change_committed_during_a_read_is_read_again(env: Env) -> None:
    env.gate.refresh_s = 3600.0
    read = env.store.list_budgets
    num_reads = 0

    def racing(tenant: str | None = None) -> list[Any]:
        nonlocal num_reads
        budgets = read(tenant)
        num_reads += 1
        if num_reads == 1:  # the change commits (and invalidates) after this read saw none
            env.store.set_budget(BudgetSpec("acme", None, BudgetUnit.TOKENS, DAY, hard_limit=5), actor="t")
            env.gate.invalidate()
        return budgets

    env.store.list_budgets = racing  # type: ignore[method-assign]
    asyncio.run(env.gate.refresh_now())
    assert num_reads == 2 and len(env.gate.budgets_of(env.context())) == 1
