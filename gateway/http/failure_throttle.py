"""Failed authentication attempts counted per subject (a key id, an address): past a limit, 429.

The throttle only ever answers attempts that already failed, so it turns a 401 into a 429 but
never refuses a valid credential (weir.gateway.http.auth explains the subjects).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from cachetools import TTLCache

from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import AuthenticationError, RateLimitError, WeirError


class FailureThrottle:
    """Counts authentication failures per subject (a key id, an address) in fixed windows.

    Callers consult it only for attempts that already failed, so it can turn a 401 into a 429
    but never refuses a valid credential. Memory is bounded: at most `max_tracked` subjects,
    each forgotten a window after its first failure. Thread-safe.
    """

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        max_tracked: int = 100_000,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_failures = max_failures
        self._window_s = window_s
        self._timer = timer
        self._windows: TTLCache[str, tuple[float, int]] = TTLCache(max_tracked, ttl=window_s, timer=timer)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: AuthSettings, *, timer: Callable[[], float] = time.monotonic
    ) -> FailureThrottle:
        return cls(settings.max_failures, settings.failure_window_s, settings.max_tracked, timer=timer)

    @classmethod
    def for_addresses(
        cls, settings: AuthSettings, *, timer: Callable[[], float] = time.monotonic
    ) -> FailureThrottle:
        """The per-address throttle of tenant keys (`max_address_failures`)."""
        return cls(
            settings.max_address_failures, settings.failure_window_s, settings.max_tracked, timer=timer
        )

    @property
    def num_tracked(self) -> int:
        """How many subjects are remembered now (bounded by `max_tracked`)."""
        with self._lock:
            return len(self._windows)

    def check(self, subject: str) -> None:
        """Raise RateLimitError (429, Retry-After) if this subject used up its failures."""
        error = self.blocked(subject)
        if error is not None:
            raise error

    def blocked(self, subject: str) -> RateLimitError | None:
        """The 429 to answer while this subject has used up its failures; None otherwise."""
        now = self._timer()
        with self._lock:
            window = self._windows.get(subject)
        if window is None:
            return None
        start, count = window
        remaining_s = start + self._window_s - now
        if count < self._max_failures or remaining_s <= 0:
            return None
        return RateLimitError(
            "Too many failed authentication attempts; retry later.",
            code="too_many_auth_failures",
            # The epsilon keeps float noise (10.000000000000002) from announcing 11 s.
            headers={"Retry-After": str(max(1, math.ceil(remaining_s - 1e-6)))},
        )

    def record_failure(self, subject: str) -> None:
        """Count one failed attempt of this subject."""
        now = self._timer()
        with self._lock:
            window = self._windows.get(subject)
            if window is None or now >= window[0] + self._window_s:
                self._windows[subject] = (now, 1)
            else:
                self._windows[subject] = (window[0], window[1] + 1)


def refuse(error: AuthenticationError, subjects: list[tuple[FailureThrottle, str]]) -> WeirError:
    """The answer to a failed attempt: 429 if any of its subjects is blocked, else count it, 401."""
    for throttle, subject in subjects:
        blocked = throttle.blocked(subject)
        if blocked is not None:
            return blocked
    for throttle, subject in subjects:
        throttle.record_failure(subject)
    return error
