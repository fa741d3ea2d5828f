"""gateway/http/failure_throttle.py: failures counted per subject in fixed windows, memory bounded."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.gateway.auth_doubles import Clocks
from weir.gateway.http.errors import RateLimitError
from weir.gateway.http.failure_throttle import FailureThrottle


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def test_throttle_memory_is_bounded(clocks: Clocks) -> None:
    throttle = FailureThrottle(3, 60, max_tracked=100, timer=clocks.timer)
    for i in range(1000):
        throttle.record_failure(f"subject-{i}")
    assert throttle.num_tracked <= 100


# -- the throttle against a model -------------------------------------------------------------------


class ThrottleMachine(RuleBasedStateMachine):
    """FailureThrottle behaves like a plain per-address fixed-window counter."""

    MAX = 3
    WINDOW = 10.0

    @initialize()
    def setup(self) -> None:
        self.t = 0.0
        self.throttle = FailureThrottle(self.MAX, self.WINDOW, timer=lambda: self.t)
        self.model: dict[str, tuple[float, int]] = {}

    def _blocked(self, addr: str) -> bool:
        window = self.model.get(addr)
        return window is not None and window[1] >= self.MAX and self.t < window[0] + self.WINDOW

    @rule(addr=st.sampled_from(["a", "b", "c"]))
    def fail(self, addr: str) -> None:
        blocked = self._blocked(addr)
        try:
            self.throttle.check(addr)
        except RateLimitError:
            assert blocked
            return
        assert not blocked
        self.throttle.record_failure(addr)
        window = self.model.get(addr)
        if window is None or self.t >= window[0] + self.WINDOW:
            self.model[addr] = (self.t, 1)
        else:
            self.model[addr] = (window[0], window[1] + 1)

    @rule(seconds=st.floats(0, 15))
    def wait(self, seconds: float) -> None:
        self.t += seconds

    @invariant()
    def check_matches_model(self) -> None:
        if not hasattr(self, "throttle"):
            return
        for addr in ("a", "b", "c"):
            try:
                self.throttle.check(addr)
                refused = False
            except RateLimitError as exc:
                refused = True
                assert 1 <= int(exc.headers["Retry-After"]) <= self.WINDOW
            assert refused == self._blocked(addr)


ThrottleMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_throttle_state_machine = ThrottleMachine.TestCase
