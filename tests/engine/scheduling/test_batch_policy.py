"""The batching policies: when waiting requests may be admitted, how many run, when a window ends."""

from __future__ import annotations

from dataclasses import replace

from tests.engine.kv_machine import make_request
from weir.engine.config import BatchPolicy, QueuePolicy, SchedulerConfig
from weir.engine.scheduling.batch_policy import (
    ContinuousBatching,
    DynamicBatching,
    StaticBatching,
    make_batching,
)
from weir.engine.scheduling.request_queue import make_waiting_queue


def _waiting(num: int, arrival_s: float = 0.0):  # type: ignore[no-untyped-def]
    queue = make_waiting_queue(QueuePolicy.FCFS)
    for i in range(num):
        req = make_request(f"r{i}", [1, 2, 3], "a")
        req.arrival_s = arrival_s
        queue.add(req)
    return queue


def test_each_policy_has_its_class() -> None:
    base = SchedulerConfig()
    for policy, cls in (
        (BatchPolicy.CONTINUOUS, ContinuousBatching),
        (BatchPolicy.STATIC, StaticBatching),
        (BatchPolicy.DYNAMIC, DynamicBatching),
    ):
        assert type(make_batching(replace(base, batch_policy=policy))) is cls


def test_continuous_admits_at_once_without_a_hold_and_holds_while_fewer_wait_than_run() -> None:
    config = replace(SchedulerConfig(), admission_hold_s=0.0)
    assert ContinuousBatching(config).may_admit(_waiting(1), 5, lambda: 0.0)
    held = ContinuousBatching(replace(config, admission_hold_s=1.0))
    assert not held.may_admit(_waiting(1), 5, lambda: 0.5)
    assert held.may_admit(_waiting(1), 5, lambda: 1.0)  # the longest wait reached the hold
    assert held.may_admit(_waiting(5), 5, lambda: 0.0)  # as many wait as run
    assert not ContinuousBatching(config).forms_groups


def test_static_waits_for_a_full_batch_or_its_wait_and_caps_the_running() -> None:
    config = replace(SchedulerConfig(), static_batch_size=4, static_max_wait_s=1.0, max_num_seqs=16)
    static = StaticBatching(config)
    assert static.max_seqs == 4 and static.forms_groups
    assert not static.may_admit(_waiting(3), 0, lambda: 0.5)
    assert static.may_admit(_waiting(4), 0, lambda: 0.0)
    assert static.may_admit(_waiting(1), 0, lambda: 1.0)
    assert not static.may_admit(_waiting(4), 1, lambda: 5.0)  # a batch runs to completion first
    assert static.window_end_s(next(iter(_waiting(1)))) == 1.0


def test_dynamic_collects_within_its_window() -> None:
    config = replace(SchedulerConfig(), dynamic_window_s=0.05, max_num_seqs=2)
    dynamic = DynamicBatching(config)
    assert dynamic.max_seqs == 2
    assert not dynamic.may_admit(_waiting(1), 0, lambda: 0.01)
    assert dynamic.may_admit(_waiting(2), 0, lambda: 0.0)
    assert dynamic.may_admit(_waiting(1), 0, lambda: 0.05)
    assert dynamic.window_end_s(next(iter(_waiting(1, arrival_s=1.0)))) == 1.05
