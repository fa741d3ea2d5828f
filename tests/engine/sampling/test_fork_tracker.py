"""PendingForks: the parent <-> children bookkeeping of n>1 forks, by example and by property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from weir.engine.request import Request, SamplingParams
from weir.engine.sampling.fork_tracker import PendingForks


def _req(rid: str, prompt: list[int] | None = None) -> Request:
    return Request(rid, prompt or [1, 2, 3], SamplingParams(max_tokens=4))


def test_children_wait_on_their_parent_and_are_taken_once() -> None:
    forks = PendingForks()
    parent, a, b = _req("p"), _req("a"), _req("b")
    forks.add(parent, [a, b])
    assert forks and len(forks) == 2 and forks.num_children("p") == 2
    assert forks.is_parent("p") and forks.is_waiting_child("a") and not forks.is_waiting_child("p")
    assert forks.take_children("p") == [a, b]
    assert not forks and len(forks) == 0 and forks.take_children("p") == []
    assert not forks.is_waiting_child("a")


def test_a_child_dropped_while_waiting_leaves_its_siblings() -> None:
    forks = PendingForks()
    parent, a, b = _req("p"), _req("a"), _req("b")
    forks.add(parent, [a, b])
    assert forks.drop_child(a) and not forks.drop_child(a)
    assert forks.num_children("p") == 1
    assert forks.drop_child(b)
    assert not forks.is_parent("p") and not forks


def test_a_fork_with_another_prompt_is_refused_and_nothing_is_recorded() -> None:
    forks = PendingForks()
    try:
        forks.add(_req("p"), [_req("a"), _req("b", [9])])
    except ValueError:
        pass
    else:
        raise AssertionError("expected ValueError")
    assert not forks and not forks.is_waiting_child("a")


def test_no_children_records_no_parent() -> None:
    forks = PendingForks()
    forks.add(_req("p"), [])
    assert not forks.is_parent("p") and forks.num_children("p") == 0


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()), max_size=40))
def test_the_two_maps_stay_consistent(ops: list[tuple[int, int, bool]]) -> None:
    """Adds, takes and drops in any order: every waiting child has exactly one parent that lists it."""
    forks = PendingForks()
    model: dict[str, list[str]] = {}
    made: dict[str, Request] = {}
    n = 0
    for parent_no, num_children, take in ops:
        pid = f"p{parent_no}"
        if take:
            assert [c.request_id for c in forks.take_children(pid)] == model.pop(pid, [])
        elif num_children and pid not in model:
            kids = [_req(f"c{n + i}") for i in range(num_children)]
            n += num_children
            made.update((k.request_id, k) for k in kids)
            forks.add(_req(pid), kids)
            model[pid] = [k.request_id for k in kids]
        elif model.get(pid):
            victim = model[pid].pop(0)
            assert forks.drop_child(made[victim])
            if not model[pid]:
                del model[pid]
        assert len(forks) == sum(len(v) for v in model.values())
        for p, kids in model.items():
            assert forks.num_children(p) == len(kids)
            assert all(forks.is_waiting_child(k) for k in kids)
