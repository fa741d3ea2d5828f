"""Token buckets, daily caps and concurrency caps: hypothesis properties on simulated time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from weir.tenancy.budgets.quotas import (
    SECONDS_PER_DAY,
    ConcurrencyLimiter,
    Denial,
    Grant,
    LimitKind,
    LocalBudget,
    TokenBucket,
    seconds_to_midnight,
)
from weir.tenancy.context import QuotaLimits

START = 1_900_000_000.0  # epoch seconds; a fixed day so tests do not depend on the real time


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class Event:
    """A change in net consumption: + on a grant, - on a refund, + on an overshoot (debt)."""

    at: float
    tokens: int
    overshoot: int = 0  # the part of `tokens` charged beyond a reservation


class BudgetMachine(RuleBasedStateMachine):
    """Reserve, settle (under or over the reservation) and let time pass.

    The level never exceeds the capacity, goes below zero only by overshoot (debt), and admissions
    in any window stay within a full bucket plus the refill plus the overshoot charged in it.
    """

    @initialize(tpm=st.integers(1, 5_000), tpd=st.one_of(st.none(), st.integers(1, 20_000)))
    def setup(self, tpm: int, tpd: int | None) -> None:
        self.clock = Clock()
        self.budget = LocalBudget(self.clock)
        self.limits = QuotaLimits(tokens_per_minute=tpm, tokens_per_day=tpd)
        self.open: list[Grant] = []
        self.events: list[Event] = []
        self.daily: dict[int, int] = {}  # net tokens counted per UTC day

    @property
    def allowance(self):  # type: ignore[no-untyped-def]
        return self.budget.allowance("t", self.limits)

    @rule(seconds=st.floats(0, 200, allow_nan=False))
    def wait(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def near_midnight(self) -> None:
        self.clock.now += seconds_to_midnight(self.clock.now) - 1.0

    @rule(num_tokens=st.integers(1, 6_000))
    def reserve(self, num_tokens: int) -> None:
        before = self.allowance.bucket.level(self.clock.now)
        result = self.budget.try_take("t", self.limits, num_tokens)
        if isinstance(result, Grant):
            assert result.num_tokens == num_tokens
            self.open.append(result)
            self.events.append(Event(self.clock.now, num_tokens))
            self.daily[result.day] = self.daily.get(result.day, 0) + num_tokens
        else:
            assert isinstance(result, Denial)
            if result.limit is LimitKind.TOKENS_PER_MINUTE:
                assert before < num_tokens
                assert (result.retry_after_s is None) == (num_tokens > self.limits.tokens_per_minute)
            else:
                assert result.limit is LimitKind.TOKENS_PER_DAY
            debt = sum(e.overshoot for e in self.events)
            assert result.remaining >= -debt and result.reset_s >= 0  # negative only by debt

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        grant = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        used = data.draw(st.integers(0, 2 * grant.num_tokens))
        refund = grant.num_tokens - used
        before = self.allowance.bucket.level(self.clock.now)
        self.budget.settle(grant, used)
        after = self.allowance.bucket.level(self.clock.now)
        today = int(self.clock.now // SECONDS_PER_DAY)
        if refund >= 0:
            # The refund lands in the bucket, up to its capacity: no refund creates tokens.
            assert after == pytest.approx(min(self.limits.tokens_per_minute, before + refund))
            assert after <= before + refund + 1e-6
            if refund:
                self.events.append(Event(self.clock.now, -refund))
                if grant.day == today:  # later refunds are dropped
                    self.daily[grant.day] -= refund
        else:
            # The overshoot is debt: charged in full, even below zero, and counted today.
            assert after == pytest.approx(before + refund)
            self.events.append(Event(self.clock.now, -refund, overshoot=-refund))
            self.daily[today] = self.daily.get(today, 0) - refund

    @invariant()
    def never_above_capacity(self) -> None:
        level = self.allowance.bucket.level(self.clock.now)
        assert level <= self.limits.tokens_per_minute + 1e-6
        debt = sum(e.overshoot for e in self.events)
        assert level >= -debt - 1e-6  # below zero only by overshoot
        daily = self.allowance.daily
        if daily is not None:
            # Every settlement is counted: today's count is exactly the model's.
            assert daily.used == self.daily.get(daily.day, 0)

    @invariant()
    def never_over_budget_in_any_window(self) -> None:
        # Net consumption over (t0, t1] is at most a full bucket plus the refill over the window
        # plus what was charged there beyond reservations.
        tpm = self.limits.tokens_per_minute
        for i, start in enumerate(self.events):
            net = overshoot = 0
            for end in self.events[i:]:
                net += end.tokens
                overshoot += end.overshoot
                assert net <= tpm + tpm / 60.0 * (end.at - start.at) + overshoot + 1e-6

    @invariant()
    def never_over_the_daily_cap_but_by_overshoot(self) -> None:
        if self.limits.tokens_per_day is None:
            return
        for day, count in self.daily.items():
            overshoot = sum(e.overshoot for e in self.events if int(e.at // SECONDS_PER_DAY) == day)
            assert 0 <= count <= self.limits.tokens_per_day + overshoot


BudgetMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestBudget = BudgetMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.integers(1, 10_000),
    used=st.integers(0, 10_000),
    want=st.integers(1, 10_000),
)
def test_waiting_retry_after_is_enough(capacity: int, used: int, want: int) -> None:
    clock = Clock()
    budget = LocalBudget(clock)
    limits = QuotaLimits(tokens_per_minute=capacity)
    budget.try_take("t", limits, min(used, capacity))
    result = budget.try_take("t", limits, want)
    if isinstance(result, Denial):
        if want > capacity:
            assert result.retry_after_s is None and "too large" in result.message
            return
        assert result.retry_after_s is not None and result.retry_after_s > 0
        clock.now += result.retry_after_s + 1e-6
        assert isinstance(budget.try_take("t", limits, want), Grant)


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 10_000), n=st.integers(1, 10_000), elapsed=st.floats(0, 120))
def test_a_full_refund_restores_the_bucket(capacity: int, n: int, elapsed: float) -> None:
    clock = Clock()
    budget = LocalBudget(clock)
    limits = QuotaLimits(tokens_per_minute=capacity)
    budget.try_take("t", limits, capacity)  # empty it
    clock.now += elapsed
    before = budget.allowance("t", limits).bucket.level(clock.now)
    grant = budget.try_take("t", limits, n)
    if isinstance(grant, Grant):
        budget.settle(grant, 0)
        assert budget.allowance("t", limits).bucket.level(clock.now) == pytest.approx(before)


def test_bucket_refills_at_the_per_minute_rate() -> None:
    bucket = TokenBucket(600, 10.0, now=0.0)
    assert bucket.try_take(600, 0.0) and not bucket.try_take(1, 0.0)
    assert bucket.level(3.0) == pytest.approx(30.0)
    assert bucket.seconds_until(100, 3.0) == pytest.approx(7.0)
    assert bucket.level(1_000.0) == 600  # capped
    assert bucket.level(500.0) == 600  # a clock going backwards takes nothing away
    assert bucket.seconds_until(601, 0.0) is None


def test_daily_cap_resets_at_utc_midnight_and_late_refunds_are_dropped() -> None:
    clock = Clock(now=(int(START // SECONDS_PER_DAY) + 1) * SECONDS_PER_DAY - 10)  # 10 s to midnight
    budget = LocalBudget(clock)
    limits = QuotaLimits(tokens_per_day=100)
    grant = budget.try_take("t", limits, 80)
    assert isinstance(grant, Grant)
    denial = budget.try_take("t", limits, 30)
    assert isinstance(denial, Denial) and denial.limit is LimitKind.TOKENS_PER_DAY
    assert denial.retry_after_s == pytest.approx(10) == pytest.approx(seconds_to_midnight(clock.now))
    assert denial.remaining == 20 and denial.limit_value == 100
    assert isinstance(budget.try_take("t", limits, 101), Denial)
    clock.now += 11
    assert isinstance(budget.try_take("t", limits, 100), Grant)
    budget.settle(grant, 0)  # counted yesterday: must not lower today's count
    assert isinstance(budget.try_take("t", limits, 1), Denial)


def test_unlimited_tenants_take_nothing_and_quota_changes_apply() -> None:
    clock = Clock()
    budget = LocalBudget(clock)
    grant = budget.try_take("t", QuotaLimits(), 10**9)
    assert isinstance(grant, Grant) and grant.unlimited
    budget.settle(grant, 0)  # nothing to return to
    small = QuotaLimits(tokens_per_minute=100)
    assert isinstance(budget.try_take("t", small, 100), Grant)
    assert isinstance(budget.try_take("t", small, 1), Denial)
    bigger = QuotaLimits(tokens_per_minute=1_000)
    # The level is kept across a change (no free refill); the refill rate follows the new limit.
    assert isinstance(budget.try_take("t", bigger, 1), Denial)
    clock.now += 6
    assert isinstance(budget.try_take("t", bigger, 100), Grant)


def test_async_take_is_the_same_as_try_take() -> None:
    budget = LocalBudget(Clock())
    limits = QuotaLimits(tokens_per_minute=10)
    assert isinstance(asyncio.run(budget.take("t", limits, 10)), Grant)
    assert isinstance(asyncio.run(budget.take("t", limits, 1)), Denial)


@settings(max_examples=100, deadline=None)
@given(cap=st.integers(1, 8), ops=st.lists(st.booleans(), max_size=60))
def test_concurrency_never_exceeds_the_cap(cap: int, ops: list[bool]) -> None:
    limiter = ConcurrencyLimiter()
    limits = QuotaLimits(max_concurrent=cap)
    held = 0
    for acquire in ops:
        if acquire:
            denial = limiter.try_acquire("t", limits)
            if held < cap:
                assert denial is None
                held += 1
            else:
                assert denial is not None and denial.limit is LimitKind.MAX_CONCURRENT
        elif held:
            limiter.release("t")
            held -= 1
        assert limiter.in_flight("t") == held <= cap


@settings(max_examples=100, deadline=None)
@given(
    tpm=st.integers(1, 5_000),
    tpd=st.integers(1, 50_000),
    ops=st.lists(st.tuples(st.integers(1, 5_000), st.floats(0, 3)), max_size=30),
)
def test_tokens_charged_equal_the_sum_of_settlements(
    tpm: int, tpd: int, ops: list[tuple[int, float]]
) -> None:
    """On a stopped clock nothing refills: the budget spent is exactly what was settled + held."""
    budget = LocalBudget(Clock())
    limits = QuotaLimits(tokens_per_minute=tpm, tokens_per_day=tpd)
    open_grants: list[Grant] = []
    settled = 0
    for i, (size, usage) in enumerate(ops):
        result = budget.try_take("t", limits, size)
        if isinstance(result, Grant):
            open_grants.append(result)
        if open_grants and i % 2:  # settle the oldest with usage between 0 and 3x its reservation
            grant = open_grants.pop(0)
            used = int(grant.num_tokens * usage)
            budget.settle(grant, used)
            settled += used
        held = sum(g.num_tokens for g in open_grants)
        allowance = budget.allowance("t", limits)
        assert allowance.bucket is not None and allowance.daily is not None
        assert allowance.bucket.level(START) == pytest.approx(tpm - settled - held)
        assert allowance.daily.used == settled + held


def test_overshoot_is_debt_that_delays_the_next_admission() -> None:
    clock = Clock()
    budget = LocalBudget(clock)
    limits = QuotaLimits(tokens_per_minute=600)  # 10 tokens per second
    grant = budget.try_take("t", limits, 100)
    assert isinstance(grant, Grant)
    budget.settle(grant, 900)  # 800 more than reserved: the bucket is 300 in debt
    assert budget.allowance("t", limits).bucket.level(clock.now) == pytest.approx(-300)
    denial = budget.try_take("t", limits, 50)
    assert isinstance(denial, Denial) and denial.limit is LimitKind.TOKENS_PER_MINUTE
    assert denial.retry_after_s == pytest.approx(35.0)  # (300 debt + 50) / 10 per second
    assert denial.remaining <= 0
    clock.now += 34.9
    assert isinstance(budget.try_take("t", limits, 50), Denial)
    clock.now += 0.2
    assert isinstance(budget.try_take("t", limits, 50), Grant)
