"""The waiting queue (engine/scheduling/request_queue.py): order per policy, the per-class waiting-token
counter under random operations, and fair share between tenants (QueuePolicy.FAIR) on the
simulated engine loop.

Fair shares are measured in tokens the scheduler actually served (prefill + decode), on the
simulated clock, so every number here is deterministic. Tolerance: a tenant's share over the
measured window is within 0.05 of its fair share.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from tests.engine.sim import Sim, reference_output, sim_request
from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.request import Priority, Request, RequestStatus, SamplingParams
from weir.engine.scheduling.request_queue import FairQueue, make_waiting_queue


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


TOLERANCE = 0.05
CONFIG = SchedulerConfig(
    max_num_batched_tokens=32, max_num_seqs=4, max_model_len=256, queue_policy=QueuePolicy.FAIR
)


class Workload:
    """Tenants that keep a backlog in the simulated engine, and the tokens each was served."""

    def __init__(self, config: SchedulerConfig = CONFIG) -> None:
        self.sim = Sim(config, num_blocks=400, caching=False)
        self.count = 0
        self.mark: dict[str, int] = {}

    def add(self, tenant: str, weight: float = 1.0, prompt_len: int = 12, max_tokens: int = 12) -> Request:
        self.count += 1
        req = sim_request(
            f"{tenant}-{self.count}",
            [self.count % 50 + 1] * prompt_len,
            max_tokens,
            tenant_id=tenant,
            cache_scope=tenant,
            arrival_s=self.sim.clock.now,
            weight=weight,
        )
        self.sim.sched.add_request(req)
        self.sim.outputs[req.request_id] = []
        return req

    def outstanding(self, tenant: str) -> int:
        return sum(1 for r in self.sim.sched.requests.values() if r.tenant_id == tenant)

    def run(self, steps: int, keep: dict[str, tuple[int, float]]) -> None:
        """Step, topping each tenant in `keep` up to (outstanding requests, weight) before each step."""
        for _ in range(steps):
            for tenant, (n, weight) in keep.items():
                while self.outstanding(tenant) < n:
                    self.add(tenant, weight)
            self.sim.step()

    def start_window(self) -> None:
        self.mark = dict(self.sim.served)

    def shares(self) -> dict[str, float]:
        served = {t: n - self.mark.get(t, 0) for t, n in self.sim.served.items()}
        total = sum(served.values())
        return {t: n / total for t, n in served.items()}


def test_a_flooding_tenant_gets_half_when_another_is_backlogged() -> None:
    w = Workload()
    for _ in range(600):  # the flood arrives first, and stays backlogged through the window
        w.add("flood")
    w.run(100, {"steady": (2, 1.0)})
    w.start_window()
    w.run(1_000, {"steady": (2, 1.0)})
    shares = w.shares()
    assert shares["steady"] == pytest.approx(0.5, abs=TOLERANCE)
    assert shares["flood"] == pytest.approx(0.5, abs=TOLERANCE)


def test_fcfs_lets_the_flood_starve_the_other_tenant() -> None:
    # The contrast: the same workload in arrival order.
    w = Workload(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=256))
    for _ in range(600):
        w.add("flood")
    w.run(100, {"steady": (2, 1.0)})
    w.start_window()
    w.run(1_000, {"steady": (2, 1.0)})
    assert w.shares().get("steady", 0.0) < 0.05


@pytest.mark.parametrize(("heavy", "light"), [(2.0, 1.0), (3.0, 1.0)])
def test_weights_set_the_shares(heavy: float, light: float) -> None:
    w = Workload()
    w.run(100, {"heavy": (6, heavy), "light": (6, light)})
    w.start_window()
    w.run(1_500, {"heavy": (6, heavy), "light": (6, light)})
    assert w.shares()["heavy"] == pytest.approx(heavy / (heavy + light), abs=TOLERANCE)


def test_a_newly_active_tenant_cannot_bank_credit() -> None:
    w = Workload()
    w.run(600, {"a": (4, 1.0), "b": (4, 1.0)})  # "late" idles while a and b are served
    queue = w.sim.sched.waiting
    assert isinstance(queue, FairQueue)
    floor = min(queue.counters["a"], queue.counters["b"])
    w.add("late")
    assert queue.counters["late"] == floor  # starts at the current minimum, not at zero
    w.start_window()
    w.run(600, {"a": (4, 1.0), "b": (4, 1.0), "late": (4, 1.0)})
    shares = w.shares()
    for tenant in ("a", "b", "late"):
        assert shares[tenant] == pytest.approx(1 / 3, abs=TOLERANCE)


def test_a_tenant_back_from_idle_gets_its_share_not_a_burst() -> None:
    w = Workload()
    w.run(300, {"a": (4, 1.0), "b": (4, 1.0)})
    w.run(400, {"a": (4, 1.0)})  # b drains and idles; its counter falls behind a's
    assert w.outstanding("b") == 0
    w.start_window()
    w.run(200, {"a": (4, 1.0), "b": (4, 1.0)})
    assert w.shares()["b"] == pytest.approx(0.5, abs=TOLERANCE)


def test_weight_comes_from_the_latest_request_and_is_validated() -> None:
    queue = FairQueue()
    queue.add(Request("r1", [1], SamplingParams(), tenant_id="t", weight=2.0))
    assert queue.weights["t"] == 2.0
    queue.add(Request("r2", [1], SamplingParams(), tenant_id="t", weight=0.5))
    assert queue.weights["t"] == 0.5
    with pytest.raises(ValueError, match="weight"):
        Request("r3", [1], SamplingParams(), weight=0.0)


def test_fair_policy_serves_interactive_before_queued_batch() -> None:
    w = Workload(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1, queue_policy=QueuePolicy.FAIR))
    for _ in range(5):
        w.sim.add(f"batch-{_}", [1, 2, 3], max_tokens=2, tenant="bulk", priority=Priority.BATCH)
    w.sim.add("interactive", [4, 5, 6], max_tokens=2, tenant="quiet", priority=Priority.INTERACTIVE)
    w.sim.step()
    assert [s.request_id for s in w.sim.steps[-1].scheduled] == ["interactive"]


@pytest.mark.parametrize("policy", [QueuePolicy.FAIR, QueuePolicy.PRIORITY])
def test_interactive_preempts_a_running_batch_request_when_blocks_are_short(policy: QueuePolicy) -> None:
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=policy)
    sim = Sim(config, num_blocks=6, caching=False)
    # 6 blocks of 4 tokens: the batch request holds 5 after its first step, the interactive one needs 3.
    sim.add("batch", list(range(16)), max_tokens=8, tenant="bulk", priority=Priority.BATCH)
    sim.step()
    assert sim.sched.requests["batch"].status is RequestStatus.RUNNING
    sim.add("interactive", list(range(12)), max_tokens=12, tenant="quiet", priority=Priority.INTERACTIVE)
    sim.step()
    assert sim.steps[-1].preempted_ids == ("batch",)
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["interactive"]
    sim.run()
    # The preempted request is recomputed later and still gives the right tokens.
    assert sim.outputs["batch"] == reference_output(list(range(16)), 8)
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_fcfs_never_preempts_for_a_higher_class() -> None:
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=QueuePolicy.FCFS)
    sim = Sim(config, num_blocks=6, caching=False)
    sim.add("batch", list(range(16)), max_tokens=8, tenant="bulk", priority=Priority.BATCH)
    sim.step()
    sim.add("interactive", list(range(12)), max_tokens=12, tenant="quiet", priority=Priority.INTERACTIVE)
    sim.step()
    assert sim.steps[-1].preempted_ids == ()
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["batch"]
