"""Waiting queues: order per policy, and the per-class waiting-token counter under random operations."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from engine.config import QueuePolicy
from engine.policies import make_waiting_queue
from engine.request import Priority, Request, SamplingParams


def _req(i: int, prio: int, length: int, tenant: str = "t") -> Request:
    return Request(
        f"r{i}", [1] * length, SamplingParams(), tenant_id=tenant, priority=Priority(prio), arrival_s=i
    )


def test_fcfs_and_priority_order() -> None:
    fcfs, prio = make_waiting_queue(QueuePolicy.FCFS), make_waiting_queue(QueuePolicy.PRIORITY)
    for q in (fcfs, prio):
        q.add(_req(0, 2, 3))
        q.add(_req(1, 0, 3))
    assert fcfs.pop().request_id == "r0" and prio.pop().request_id == "r1"


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(list(QueuePolicy)),
    st.lists(
        st.tuples(
            st.sampled_from(["add", "prepend", "remove", "pop"]),
            st.integers(0, 7),
            st.integers(0, 2),
            st.integers(1, 50),
        ),
        max_size=60,
    ),
)
def test_waiting_tokens_by_priority_match_the_queue(policy: QueuePolicy, ops: list) -> None:  # type: ignore[type-arg]
    queue = make_waiting_queue(policy)
    reqs: dict[int, Request] = {}
    for op, i, prio, length in ops:
        if op in ("add", "prepend"):
            if i in reqs:
                continue
            reqs[i] = _req(i, prio, length, tenant=f"t{i % 3}")
            getattr(queue, op)(reqs[i])
        elif op == "remove" and i in reqs:
            queue.remove(reqs.pop(i))
        elif op == "pop" and len(queue):
            popped = queue.pop()
            reqs.pop(int(popped.request_id[1:]))
        expected = [0, 0, 0]
        for r in queue:
            expected[int(r.priority)] += r.num_remaining
        assert queue.waiting_tokens_by_priority == expected
        assert len(queue) == len(reqs)
