"""The grammar masks' worker pool shares its threads fairly between tenants."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.engine.structured.mask_pool import FairMaskPool


class _Gate:
    """A job that holds its worker until released, recording that it ran."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.started.set()
        assert self.release.wait(10), "a gated job was never released"
        return "done"


def test_a_tenant_holding_every_worker_does_not_queue_another_tenants_mask() -> None:
    pool = FairMaskPool(num_workers=2, max_workers=4)
    slow = [_Gate() for _ in range(3)]
    try:
        held = [pool.submit("hostile", f"h{i}", gate) for i, gate in enumerate(slow)]
        assert slow[0].started.wait(5) and slow[1].started.wait(5)
        assert pool.num_waiting("hostile") == 1  # its third mask waits for its own workers
        assert pool.run_started_s("h2") is None
        victim = pool.submit("victim", "v", lambda: "mask")
        assert victim.result(timeout=5) == "mask"  # served at once, on a thread started for it
        assert pool.num_extra_started == 1 and pool.run_started_s("v") is not None
    finally:
        for gate in slow:
            gate.release.set()
    assert [f.result(timeout=5) for f in held] == ["done"] * 3
    pool.close()


def test_a_tenant_with_a_mask_running_gets_no_extra_thread() -> None:
    pool = FairMaskPool(num_workers=1, max_workers=4)
    gates = [_Gate(), _Gate()]
    try:
        first = pool.submit("acme", "a1", gates[0])
        assert gates[0].started.wait(5)
        second = pool.submit("acme", "a2", gates[1])
        assert pool.num_threads == 1 and pool.num_extra_started == 0
        assert not gates[1].started.is_set() and pool.run_started_s("a2") is None
        gates[0].release.set()
        assert first.result(timeout=5) == "done" and gates[1].started.wait(5)
        assert pool.run_started_s("a2") is not None  # its time budget starts only now
    finally:
        for gate in gates:
            gate.release.set()
    assert second.result(timeout=5) == "done"
    pool.close()


def test_a_free_worker_takes_the_tenant_with_fewest_masks_running() -> None:
    pool = FairMaskPool(num_workers=1, max_workers=1)
    order: list[str] = []
    block = _Gate()
    try:
        pool.submit("a", "a0", block)
        assert block.started.wait(5)
        futures: list[Future[None]] = []
        for key in ("a1", "a2", "a3"):
            futures.append(pool.submit("a", key, lambda k=key: order.append(k)))  # type: ignore[misc]
        futures.append(pool.submit("b", "b1", lambda: order.append("b1")))  # type: ignore[func-returns-value]
    finally:
        block.release.set()
    for f in futures:
        f.result(timeout=5)
    # b had nothing running and was never served: it goes before a's second mask.
    assert order[0] == "b1" and order[1:] == ["a1", "a2", "a3"]
    pool.close()


def test_a_failing_job_fails_only_its_future() -> None:
    pool = FairMaskPool(num_workers=1, max_workers=2)

    def boom() -> None:
        raise ValueError("bad grammar state")

    bad = pool.submit("a", "x", boom)
    good = pool.submit("b", "y", lambda: 7)
    with pytest.raises(ValueError, match="bad grammar state"):
        bad.result(timeout=5)
    assert good.result(timeout=5) == 7
    pool.close()


def test_close_cancels_what_waits_and_refuses_new_jobs() -> None:
    pool = FairMaskPool(num_workers=1, max_workers=1)
    gate = _Gate()
    running = pool.submit("a", "a0", gate)
    assert gate.started.wait(5)
    waiting = pool.submit("a", "a1", lambda: 1)
    pool.close()
    gate.release.set()
    assert running.result(timeout=5) == "done" and waiting.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("a", "a2", lambda: 1)


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        FairMaskPool(num_workers=0, max_workers=1)
    with pytest.raises(ValueError, match="max_workers"):
        FairMaskPool(num_workers=3, max_workers=2)


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=24),
    workers=st.integers(1, 3),
    extra=st.integers(0, 3),
)
def test_every_job_runs_exactly_once_and_threads_stay_bounded(
    jobs: list[str], workers: int, extra: int
) -> None:
    pool = FairMaskPool(num_workers=workers, max_workers=workers + extra)
    ran: list[str] = []
    lock = threading.Lock()
    peak = [0]

    def job(key: str) -> str:
        with lock:
            ran.append(key)
            peak[0] = max(peak[0], pool._threads)
        return key

    futures = {
        f"{owner}{i}": pool.submit(owner, f"{owner}{i}", lambda k=f"{owner}{i}": job(k))
        for i, owner in enumerate(jobs)
    }
    assert {k: f.result(timeout=10) for k, f in futures.items()} == {k: k for k in futures}
    assert sorted(ran) == sorted(futures) and peak[0] <= workers + extra
    pool.close()
