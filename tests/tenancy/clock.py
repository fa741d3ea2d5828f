"""A settable UTC clock for repository tests."""

from __future__ import annotations

import datetime as dt

START = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


class FakeClock:
    """A settable UTC clock for the repository."""

    def __init__(self, now: dt.datetime = START) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += dt.timedelta(**delta)
