"""The store's fair I/O queue (engine/kv/store/fair_queue.py): bounds, fairness between owners,
cancel, and a flooding owner that cannot delay another's job beyond one job's time."""

from __future__ import annotations

import threading

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from weir.engine.kv.store.fair_queue import FairQueue

OWNERS = ("a", "b", "c")


class FairQueueMachine(RuleBasedStateMachine):
    """Puts, takes, dones and cancels at random; a model of what is queued and running."""

    def __init__(self) -> None:
        super().__init__()
        self.q: FairQueue[int] = FairQueue(max_items=6, max_per_owner=4, max_running_per_owner=2)
        self.queued: dict[str, list[int]] = {o: [] for o in OWNERS}
        self.running: dict[str, int] = dict.fromkeys(OWNERS, 0)
        self.next_key = 1

    @rule(owner=st.sampled_from(OWNERS))
    def put(self, owner: str) -> None:
        key = self.next_key
        self.next_key += 1
        mine = len(self.queued[owner])
        longest = max(len(v) for v in self.queued.values())
        total = sum(len(v) for v in self.queued.values())
        room = self.q.room(owner)
        accepted, shed = self.q.put(owner, key, key)
        if mine < 4 and (total < 6 or longest >= mine + 2):
            assert accepted, "refused though its backlog is not the longest"
        if not accepted:
            assert room == 0 and not shed
            assert mine >= 4 or (total >= 6 and longest < mine + 2)
            return
        assert room >= 1
        for job in shed:  # the newest of the longest backlog, never the putter's
            assert job.owner != owner and self.queued[job.owner][-1] == job.key
            assert len(self.queued[job.owner]) == longest
            self.queued[job.owner].pop()
        self.queued[owner].append(key)

    @rule()
    def take(self) -> None:
        jobs = self.q.take(timeout=0)
        assert jobs is not None
        eligible = [o for o in OWNERS if self.queued[o] and self.running[o] < 2]
        if not eligible:
            assert jobs == []
            return
        (job,) = jobs
        fewest = min(self.running[o] for o in eligible)
        assert self.running[job.owner] == fewest, "an owner with more running went first"
        assert self.queued[job.owner][0] == job.key  # each owner's jobs in order
        self.queued[job.owner].pop(0)
        self.running[job.owner] += 1

    @rule(owner=st.sampled_from(OWNERS))
    def done(self, owner: str) -> None:
        if self.running[owner]:
            self.q.done(owner)
            self.running[owner] -= 1

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        keys = [k for v in self.queued.values() for k in v]
        key = data.draw(st.sampled_from(keys)) if keys and data.draw(st.booleans()) else 10_000
        job = self.q.cancel(key)
        if key == 10_000:
            assert job is None
            return
        assert job is not None and job.key == key
        self.queued[job.owner].remove(key)

    @invariant()
    def counts_match(self) -> None:
        for o in OWNERS:
            assert self.q.queued(o) == len(self.queued[o]) <= 4
            assert self.q.running(o) == self.running[o] <= 2
        assert self.q.queued() <= 6


TestFairQueue = FairQueueMachine.TestCase
TestFairQueue.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


def test_round_robin_between_owners_for_batches() -> None:
    q: FairQueue[int] = FairQueue(max_items=100, max_per_owner=100)
    for i in range(5):
        q.put("flood", i, i)
    q.put("other", 99, 99)
    jobs = q.take(3)
    assert jobs is not None and [j.owner for j in jobs] == ["flood", "other", "flood"]


def test_close_drains_or_discards_and_a_kick_wakes_the_taker() -> None:
    q: FairQueue[int] = FairQueue(max_items=4, max_per_owner=4)
    q.kick()
    assert q.take() == []
    q.put("a", 1, 1)
    assert q.close(discard=False) == []
    assert not q.put("a", 2, 2)[0]
    jobs = q.take()
    assert jobs is not None and jobs[0].key == 1
    assert q.take() is None
    q2: FairQueue[int] = FairQueue(max_items=4, max_per_owner=4)
    q2.put("a", 1, 1)
    assert [j.key for j in q2.close(discard=True)] == [1] and q2.take() is None


def test_a_flooding_owner_cannot_delay_another_owners_job_beyond_one_job() -> None:
    """Two threads take jobs that block until released (a fetch's time): the flooder holds at most
    one thread, so the victim's job starts while every flood job is still blocked."""
    q: FairQueue[str] = FairQueue(max_items=64, max_per_owner=32, max_running_per_owner=1)
    release = threading.Event()
    started: list[str] = []
    victim_started = threading.Event()

    def worker() -> None:
        while (jobs := q.take()) is not None:
            started.append(jobs[0].item)
            if jobs[0].owner == "victim":
                victim_started.set()
            else:
                release.wait()
            q.done(jobs[0].owner)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(20):
        assert q.put("flood", i, f"f{i}")[0]
    assert q.put("victim", 100, "v")[0]
    assert victim_started.wait(10), "the victim waited for a flood job to finish"
    assert started.count("v") == 1 and len([s for s in started if s.startswith("f")]) == 1
    release.set()
    q.close(discard=True)
    for t in threads:
        t.join(10)
