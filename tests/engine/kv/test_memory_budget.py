"""The process-wide memory budget: reservations never exceed it, release returns what was reserved."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from weir.engine.kv.memory_budget import MemoryBudget, MemoryBudgetError, VersionFootprint


def test_footprint_counts_weights_and_whole_kv_blocks_with_the_reserved_one() -> None:
    fp = VersionFootprint(weights_bytes=1000, kv_tokens=33, kv_bytes_per_token=10, block_size=16)
    assert fp.num_blocks == 3 + 1  # ceil(33 / 16) + the null block
    assert fp.kv_bytes == 4 * 16 * 10
    assert fp.num_bytes == 1000 + 640
    assert "1640 bytes" in fp.describe() and "33 tokens" in fp.describe()


@pytest.mark.parametrize("field", ["weights_bytes", "kv_bytes_per_token"])
def test_footprint_refuses_negative_sizes_naming_the_field(field: str) -> None:
    kwargs = {"weights_bytes": 1, "kv_tokens": 1, "kv_bytes_per_token": 1, "block_size": 16, field: -1}
    with pytest.raises(ValueError, match=field):
        VersionFootprint(**kwargs)


def test_a_reservation_that_does_not_fit_is_refused_with_the_numbers_and_changes_nothing() -> None:
    budget = MemoryBudget(1000)
    budget.reserve("m@v1", 700)
    with pytest.raises(MemoryBudgetError) as info:
        budget.reserve("m@v2", 400, what="400 bytes (weights 300 + KV 100)")
    err = info.value
    assert (err.needed_bytes, err.free_bytes, err.total_bytes) == (400, 300, 1000)
    assert "m@v2" in str(err) and "weights 300" in str(err) and "300 of 1000" in str(err)
    assert budget.held("m@v1") == 700 and budget.held("m@v2") == 0 and budget.free_bytes == 300


def test_one_reservation_per_owner_and_release_of_nothing_is_zero() -> None:
    budget = MemoryBudget(100)
    budget.reserve("a", 10)
    with pytest.raises(ValueError, match="already holds"):
        budget.reserve("a", 10)
    assert budget.release("b") == 0
    assert budget.release("a") == 10 and budget.free_bytes == 100


def test_budget_and_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="total_bytes"):
        MemoryBudget(0)
    with pytest.raises(ValueError, match="num_bytes"):
        MemoryBudget(10).reserve("a", -1)


class BudgetMachine(RuleBasedStateMachine):
    """Random reserve / release sequences: the books always balance and never exceed the total."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = MemoryBudget(1000)
        self.model: dict[str, int] = {}

    @rule(owner=st.sampled_from("abcdef"), num_bytes=st.integers(0, 600))
    def reserve(self, owner: str, num_bytes: int) -> None:
        if owner in self.model:
            with pytest.raises(ValueError):
                self.budget.reserve(owner, num_bytes)
            return
        free = 1000 - sum(self.model.values())
        if num_bytes > free:
            with pytest.raises(MemoryBudgetError) as info:
                self.budget.reserve(owner, num_bytes)
            assert info.value.free_bytes == free and info.value.needed_bytes == num_bytes
            return
        assert self.budget.reserve(owner, num_bytes).num_bytes == num_bytes
        self.model[owner] = num_bytes

    @rule(owner=st.sampled_from("abcdef"))
    def release(self, owner: str) -> None:
        assert self.budget.release(owner) == self.model.pop(owner, 0)

    @invariant()
    def books_balance(self) -> None:
        assert self.budget.reserved_bytes == sum(self.model.values()) <= self.budget.total_bytes
        assert self.budget.free_bytes == 1000 - sum(self.model.values()) >= 0
        assert {r.owner: r.num_bytes for r in self.budget.reservations()} == self.model


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
