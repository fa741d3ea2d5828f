"""The circuit breaker: closed -> open after failures in a row -> half-open probe -> closed or open."""

from __future__ import annotations

import logging

import pytest

from weir.engine.kv.store.circuit_breaker import CircuitBreaker
from weir.engine.kv.store.stats import BreakerState


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_in_a_row_open_it_and_one_probe_after_the_pause_closes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    b = CircuitBreaker("store", failure_threshold=2, open_s=5.0, clock=clock)
    caplog.set_level(logging.WARNING, "weir.engine")
    b.record_failure("x")
    assert b.state is BreakerState.CLOSED and b.allow()
    b.record_success()  # a success resets the count: failures must be in a row
    b.record_failure("x")
    assert b.state is BreakerState.CLOSED
    b.record_failure("timeout")
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.now = 5.0
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow() and not b.allow()  # one probe only
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.allow()
    changes = [r.getMessage() for r in caplog.records]
    assert len(changes) == 3  # one line per change: open, half-open, closed
    assert "CLOSED -> OPEN" in changes[0] and "timeout" in changes[0]
    assert "OPEN -> HALF_OPEN" in changes[1] and "HALF_OPEN -> CLOSED" in changes[2]


def test_a_failed_probe_opens_it_again_for_another_pause() -> None:
    clock = _Clock()
    b = CircuitBreaker("store", failure_threshold=1, open_s=1.0, clock=clock)
    b.record_failure()
    clock.now = 1.0
    assert b.allow()
    b.record_failure("still down")
    assert b.state is BreakerState.OPEN and b.num_opened == 2
    clock.now = 1.5
    assert not b.allow()
    clock.now = 2.0
    assert b.allow()


def test_bad_settings_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker("s", failure_threshold=0)
    with pytest.raises(ValueError, match="open_s"):
        CircuitBreaker("s", open_s=0)
