"""A circuit breaker for a dependency that may fail or stall (the shared KV store).

Closed: calls go through; `failure_threshold` failures in a row open it. Open: calls are refused
(the caller recomputes) for `open_s`. Then half-open: one probe call goes through; its success
closes the breaker, its failure opens it again. Every state change is logged once. Thread-safe:
the store's I/O threads record outcomes, the engine thread asks whether to try.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from weir.engine.kv.store.stats import BreakerState

logger = logging.getLogger("weir.engine")


class CircuitBreaker:
    """Closed / open / half-open over consecutive failures of one dependency."""

    def __init__(
        self,
        name: str,
        failure_threshold: int = 3,
        open_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if open_s <= 0:
            raise ValueError(f"open_s must be > 0, got {open_s}")
        self.name = name
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False  # half-open: the one probe is out
        self.num_opened = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._maybe_half_open()
            return self._state

    def allow(self) -> bool:
        """Whether a call may go to the dependency now (half-open: only the first, the probe)."""
        with self._lock:
            self._maybe_half_open()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN and not self._probing:
                self._probing = True
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            if self._state is not BreakerState.CLOSED:
                self._set(BreakerState.CLOSED, "a call succeeded")

    def record_failure(self, reason: str = "") -> None:
        with self._lock:
            self._failures += 1
            self._probing = False
            if self._state is BreakerState.HALF_OPEN or (
                self._state is BreakerState.CLOSED and self._failures >= self.failure_threshold
            ):
                self._opened_at = self.clock()
                self.num_opened += 1
                self._set(BreakerState.OPEN, f"{self._failures} failure(s) in a row, last: {reason}")

    def _maybe_half_open(self) -> None:
        if self._state is BreakerState.OPEN and self.clock() - self._opened_at >= self.open_s:
            self._set(BreakerState.HALF_OPEN, f"{self.open_s:g} s passed; the next call probes")

    def _set(self, state: BreakerState, why: str) -> None:
        logger.warning("%s circuit breaker: %s -> %s (%s)", self.name, self._state.name, state.name, why)
        self._state = state
