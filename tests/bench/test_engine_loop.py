"""weir_bench.engine_loop: the one loop that steps an engine until every request is done."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from weir.engine.client import EngineRequest
from weir.engine.request import SamplingParams
from weir_bench.engine_loop import run_until_done


@dataclass
class Out:
    """The part of a RequestOutput the loop passes through."""

    request_id: str
    step: int


@dataclass
class FakeEngine:
    """Each request needs `steps_each` steps; every step yields one output per running request."""

    clock: FakeClock
    steps_each: int = 2
    left: dict[str, int] = field(default_factory=dict)
    added_at: dict[str, float] = field(default_factory=dict)
    num_steps: int = 0

    def add_request(self, er: EngineRequest) -> None:
        self.left[er.request_id] = self.steps_each
        self.added_at[er.request_id] = self.clock.now

    def has_unfinished(self) -> bool:
        return bool(self.left)

    def step(self) -> list[Out]:  # one step takes 1 s of the fake clock
        self.num_steps += 1
        self.clock.now += 1.0
        outs = [Out(rid, self.num_steps) for rid in self.left]
        for rid in list(self.left):
            self.left[rid] -= 1
            if self.left[rid] == 0:
                del self.left[rid]
        return outs


@dataclass
class FakeClock:
    now: float = 0.0
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _req(rid: str, at: float) -> EngineRequest:
    return EngineRequest(rid, (1, 2, 3), SamplingParams(max_tokens=2), arrival_s=at)


def test_runs_requests_already_added_to_the_end() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock)
    engine.add_request(_req("a", 0.0))
    engine.add_request(_req("b", 0.0))
    outs = list(run_until_done(engine, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert [(o.request_id, o.step) for o in outs] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert not engine.has_unfinished() and clock.slept == []
    assert list(run_until_done(engine, clock=clock, sleep=clock.sleep)) == []  # type: ignore[arg-type]


def test_arrivals_join_at_their_time_in_order_and_the_loop_sleeps_while_idle() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock)
    arrivals = [_req("late", 10.0), _req("first", 0.0), _req("second", 1.0)]  # any order
    outs = list(run_until_done(engine, arrivals, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    # first joins at 0 and runs steps 1-2 (t 0->2); second joined at t=1, so it runs in step 2 and 3;
    # then the engine is idle until "late" arrives at t=10: one sleep of 7 s.
    assert engine.added_at == {"first": 0.0, "second": 1.0, "late": 10.0}
    assert clock.slept == [7.0]
    assert [o.request_id for o in outs] == ["first", "first", "second", "second", "late", "late"]
    assert not engine.has_unfinished()


def test_max_steps_bounds_the_loop() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, steps_each=5)
    engine.add_request(_req("a", 0.0))
    with pytest.raises(RuntimeError, match="after 3 engine steps"):
        list(run_until_done(engine, max_steps=3, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert engine.num_steps == 3
