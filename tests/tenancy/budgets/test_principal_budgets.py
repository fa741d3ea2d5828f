"""Tenant and key budgets together: the tighter applies, refusals give back, exact under races."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from weir.engine.request import Priority
from weir.tenancy.budgets.leases import LeasedBudget, LeaseStore, SubjectRows
from weir.tenancy.budgets.principal_budgets import PrincipalBudgets, Reservation
from weir.tenancy.budgets.quotas import Denial, LimitKind, LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext, narrowest
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

START = 1_900_000_000.0


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


def context(tenant: QuotaLimits, key: QuotaLimits, key_id: str = "k1") -> TenantContext:
    return TenantContext("acme", key_id, Priority.STANDARD, 1.0, "acme", tenant, key_quota=key)


def local(clock: Clock) -> PrincipalBudgets:
    return PrincipalBudgets(LocalBudget(clock), LocalBudget(clock), LocalBudget(clock), LocalBudget(clock))


def admitted(results: list[Reservation | Denial]) -> int:
    return sum(isinstance(r, Reservation) for r in results)


@pytest.mark.parametrize(
    ("tenant", "key", "expected"),
    [
        pytest.param(QuotaLimits(tokens_per_minute=1_000), QuotaLimits(tokens_per_minute=300), 3, id="key-narrower"),
        pytest.param(QuotaLimits(tokens_per_minute=300), QuotaLimits(tokens_per_minute=1_000), 3, id="tenant-narrower"),
        pytest.param(QuotaLimits(requests_per_minute=5), QuotaLimits(requests_per_minute=2), 2, id="key-rpm-narrower"),
        pytest.param(QuotaLimits(requests_per_minute=2), QuotaLimits(requests_per_minute=5), 2, id="tenant-rpm-narrower"),
        pytest.param(QuotaLimits(tokens_per_day=400), QuotaLimits(tokens_per_day=250), 2, id="key-day-narrower"),
    ],
)  # fmt: skip
def test_the_tighter_of_tenant_and_key_applies(tenant: QuotaLimits, key: QuotaLimits, expected: int) -> None:
    budgets = local(Clock())
    results = [asyncio.run(budgets.take(context(tenant, key), 100)) for _ in range(10)]
    assert admitted(results) == expected
    assert all(isinstance(r, Denial) for r in results[expected:])


def test_a_key_refusal_gives_back_what_the_tenant_granted() -> None:
    clock = Clock()
    budgets = local(clock)
    ctx = context(
        QuotaLimits(tokens_per_minute=1_000, requests_per_minute=100), QuotaLimits(tokens_per_minute=300)
    )
    results = [asyncio.run(budgets.take(ctx, 100)) for _ in range(5)]
    assert admitted(results) == 3
    tenant_tokens = budgets.tenant_tokens
    assert isinstance(tenant_tokens, LocalBudget)
    # Only the three admitted requests are counted against the tenant, tokens and requests.
    assert tenant_tokens.allowance("acme", ctx.quota).bucket.level(clock()) == 700  # type: ignore[union-attr]
    requests = budgets.tenant_requests
    assert isinstance(requests, LocalBudget)
    assert requests.allowance("acme", QuotaLimits(tokens_per_minute=100)).bucket.level(clock()) == 97  # type: ignore[union-attr]
    denial = results[-1]
    assert isinstance(denial, Denial) and "API key" in denial.message


def test_another_key_of_the_tenant_has_its_own_budget_within_the_tenants() -> None:
    budgets = local(Clock())
    tenant = QuotaLimits(tokens_per_minute=500)
    a, b = context(tenant, QuotaLimits(tokens_per_minute=300), "ka"), context(tenant, QuotaLimits(), "kb")
    assert admitted([asyncio.run(budgets.take(a, 100)) for _ in range(4)]) == 3
    assert admitted([asyncio.run(budgets.take(b, 100)) for _ in range(4)]) == 2  # the tenant's 500 is spent


def test_requests_per_minute_refusal_says_requests_and_when() -> None:
    clock = Clock()
    budgets = local(clock)
    ctx = context(QuotaLimits(), QuotaLimits(requests_per_minute=2))
    first = asyncio.run(budgets.take(ctx, 10))
    assert isinstance(first, Reservation)
    assert first.requests is not None and (first.requests.limit, first.requests.remaining) == (2, 1)
    assert first.tokens is None  # no tokens-per-minute limit anywhere: no tokens window
    asyncio.run(budgets.take(ctx, 10))
    denial = asyncio.run(budgets.take(ctx, 10))
    assert isinstance(denial, Denial)
    assert denial.limit is LimitKind.REQUESTS_PER_MINUTE and denial.limit_value == 2
    assert denial.retry_after_s == pytest.approx(30.0)  # one request refills in 60 / 2 s
    clock.now += 30
    assert isinstance(asyncio.run(budgets.take(ctx, 10)), Reservation)


def test_narrowest_request_bounds_and_models() -> None:
    tenant = QuotaLimits(max_prompt_tokens=100, max_output_tokens=50, models=("a", "b"))
    key = QuotaLimits(max_prompt_tokens=200, max_output_tokens=10, models=("b",))
    merged = narrowest(tenant, key)
    assert (merged.max_prompt_tokens, merged.max_output_tokens, merged.models) == (100, 10, ("b",))
    ctx = context(tenant, key)
    assert ctx.allows_model("b") and not ctx.allows_model("a") and not ctx.allows_model("c")
    assert context(QuotaLimits(), QuotaLimits(models=("x",))).allows_model("x")
    assert not context(QuotaLimits(models=("y",)), QuotaLimits(models=("x",))).allows_model("x")
    assert narrowest(tenant, QuotaLimits()) == tenant


def _leased(db: Database, clock: Clock) -> PrincipalBudgets:
    def one(rows: SubjectRows | None = None) -> LeasedBudget:
        store = LeaseStore(Database(db.url), clock, rows=rows)  # type: ignore[arg-type]
        return LeasedBudget(store, clock=clock)  # type: ignore[arg-type]

    return PrincipalBudgets(
        one(),
        one(SubjectRows("key:tokens:")),
        one(SubjectRows("tenant:requests:")),
        one(SubjectRows("key:requests:")),
    )


@pytest.mark.parametrize(
    ("key", "size", "allowed"),
    [
        pytest.param(QuotaLimits(tokens_per_minute=800), 100, 8, id="tokens"),
        pytest.param(QuotaLimits(requests_per_minute=5), 1, 5, id="requests"),
    ],
)
def test_concurrent_requests_against_a_key_budget_admit_exactly_the_allowed_number(
    migrated: Database, repo: TenancyRepo, key: QuotaLimits, size: int, allowed: int
) -> None:
    """Two replicas leasing from one database, 40 requests at once: exactly `allowed` admitted."""
    repo.create_tenant(TenantSpec(name="acme", quota=QuotaLimits(tokens_per_minute=100_000)), actor="t")
    key_id = repo.issue_key("acme", KeySpec(), actor="t").view.id
    repo.set_key_limits(key_id, key, actor="t")
    clock = Clock()  # frozen: nothing refills during the race
    replicas = [_leased(migrated, clock), _leased(migrated, clock)]
    ctx = context(QuotaLimits(tokens_per_minute=100_000), key, key_id)

    async def race() -> list[Reservation | Denial]:
        return await asyncio.gather(*(replicas[i % 2].take(ctx, size) for i in range(40)))

    results = asyncio.run(race())
    assert admitted(results) == allowed
    # The refused requests took nothing from the tenant: its bucket holds exactly what was admitted.
    state = LeaseStore(migrated, clock).state("acme", ctx.quota)
    held = sum(r.tenant_tokens.held("acme") for r in replicas)  # type: ignore[attr-defined]
    assert state is not None and 100_000 - state.tokens - held == allowed * size
