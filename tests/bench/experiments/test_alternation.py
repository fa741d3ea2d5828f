"""weir_bench.experiments.alternation: rounds alternate the order of the systems, and a ratio is
summarised by its median over the rounds against its target."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir_bench.experiments.alternation import RoundRatios, round_orders, summarise


def test_rounds_alternate_the_order() -> None:
    assert round_orders(["llama", "weir"], 4) == [
        ["llama", "weir"],
        ["weir", "llama"],
        ["llama", "weir"],
        ["weir", "llama"],
    ]
    assert round_orders(["a", "b", "c"], 1) == [["a", "b", "c"]]


@given(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=5, unique=True), st.integers(1, 9))
def test_every_system_runs_once_a_round_and_never_twice_in_a_row_at_a_turn(
    systems: list[str], rounds: int
) -> None:
    orders = round_orders(systems, rounds)
    assert len(orders) == rounds
    assert all(sorted(order) == sorted(systems) for order in orders)
    for before, after in zip(orders, orders[1:], strict=False):
        assert before[-1] == after[0]  # the turn: the last system of a round opens the next
    if len(systems) > 1 and rounds % 2 == 0:
        # over an even number of rounds every system holds each position equally often
        for system in systems:
            positions = [order.index(system) for order in orders]
            assert sum(positions) == rounds * (len(systems) - 1) / 2


def test_rounds_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        round_orders(["a"], 0)
    with pytest.raises(ValueError, match="each system once"):
        round_orders(["a", "a"], 2)


def test_a_ratio_is_judged_on_its_median_and_counted_per_round() -> None:
    itl = RoundRatios("itl_p50", (0.9, 1.2, 0.95), target=1.0, higher_is_better=False)
    assert itl.median == 0.95 and itl.spread == (0.9, 1.2)
    assert itl.median_met and itl.rounds_met == 2
    assert itl.line() == (
        "itl_p50: median 0.95 (0.90-1.20), target <= 1.0: met on the median; met in 2 of 3 rounds"
    )
    tok = RoundRatios("tok", (0.9, 1.1), target=1.0, higher_is_better=True)
    assert tok.median == 1.0 and tok.median_met and tok.rounds_met == 1


def test_summarise_takes_each_targeted_ratio_from_every_round() -> None:
    per_round = [
        {"output_tok_s": 1.2, "itl_p50": 1.1, "ttft_p50": 0.4},
        {"output_tok_s": 1.0, "itl_p50": 0.9, "ttft_p50": 0.5},
    ]
    got = summarise(per_round, {"output_tok_s": (1.0, True), "itl_p50": (1.0, False)}, prefix="w / p ")
    assert [(r.name, r.values) for r in got] == [
        ("w / p output_tok_s", (1.2, 1.0)),
        ("w / p itl_p50", (1.1, 0.9)),
    ]
    assert got[0].median_met and got[1].median_met and got[1].rounds_met == 1
    with pytest.raises(ValueError, match="no rounds"):
        summarise([], {"itl_p50": (1.0, False)})
    with pytest.raises(KeyError):
        summarise([{"itl_p50": 1.0}, {}], {"itl_p50": (1.0, False)})
