"""Budget windows: which stretch of time a budget counts, and when it resets. Pure arithmetic.

A windowed budget (tokens or money, `weir.tenancy.budgets.window_budgets`) counts what is used in its current
window and starts again at the next one. Windows:

- `minute`, `hour`: fixed length, aligned to UTC (every zone's hours are 60 minutes long; a zone
  with a half-hour offset would only change their labels).
- `day`, `month`: calendar days and months of the budget's IANA time zone (UTC by default). They
  start at local midnight (of the first of the month), so a day is 23 or 25 hours long across a
  DST change. A local midnight that does not exist (a zone that springs forward at midnight)
  starts at the first instant after the gap; one that exists twice starts at its first occurrence.
- `rolling`: the last `rolling_s` seconds, kept as `ROLLING_BUCKETS` buckets of `rolling_s /
  ROLLING_BUCKETS` seconds each: a charge counts for at least `rolling_s` minus one bucket and at
  most `rolling_s` (the bucket it fell in leaves the window as a whole).

Every window is counted in buckets keyed by their start (epoch seconds, an int): a calendar
window is one bucket (itself); a rolling window is the last `ROLLING_BUCKETS` buckets. So storage
and counting are the same for every kind: `bucket_start(t)` is where a charge at `t` is added,
`counted_from(t)` the oldest bucket start that still counts at `t`, `counted_buckets(t)` every
bucket counted at `t` with its end, and `expires_at(b)` when bucket `b` stops counting (for a calendar window: its end, the next window's start, the reset).

Times are epoch seconds (floats in, ints out). No I/O, no torch, no wall clock: callers pass `t`.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from dataclasses import dataclass
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

ROLLING_BUCKETS = 60
MIN_ROLLING_S = ROLLING_BUCKETS  # a bucket is at least one second
MAX_ROLLING_S = 366 * 86_400
MAX_TIME_ZONE_LEN = 64
_EPOCH = dt.datetime(1970, 1, 1)  # naive: the UTC wall clock


class WindowKind(enum.StrEnum):
    """The stretch of time a budget counts."""

    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"
    ROLLING = "rolling"


_FIXED_S = {WindowKind.MINUTE: 60, WindowKind.HOUR: 3600}


class WindowError(ValueError):
    """A window that cannot be built: unknown time zone, bad rolling length."""


@lru_cache(maxsize=256)
def time_zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; WindowError if unknown (or not a plain zone name)."""
    if not name or len(name) > MAX_TIME_ZONE_LEN or name.startswith(("/", ".")) or ".." in name:
        raise WindowError(f"unknown time zone {name[:MAX_TIME_ZONE_LEN]!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise WindowError(f"unknown time zone {name!r}") from exc


@dataclass(frozen=True)
class Window:
    """[start, end) in epoch seconds."""

    start: int
    end: int


def _utc_seconds(wall: dt.datetime) -> int:
    """A naive UTC wall time as epoch seconds (exact, any year)."""
    return (wall - _EPOCH) // dt.timedelta(seconds=1)


def _wall(t: float, zone: ZoneInfo) -> dt.datetime:
    """The naive local wall time of epoch second `t` in `zone`."""
    return (
        (_EPOCH + dt.timedelta(seconds=math.floor(t)))
        .replace(tzinfo=dt.UTC)
        .astimezone(zone)
        .replace(tzinfo=None)
    )


def resolve(wall: dt.datetime, zone: ZoneInfo) -> int:
    """The first instant (epoch seconds) whose local wall time in `zone` is at least `wall`.

    A wall time that exists once: that instant. Twice (clocks set back): the first. Never (in a
    gap, clocks set forward): the end of the gap.
    """
    first = _utc_seconds(wall - (wall.replace(tzinfo=zone, fold=0).utcoffset() or dt.timedelta()))
    if _wall(first, zone) == wall:
        # fold=0 is the earlier of two occurrences; an earlier instant with this wall time
        # would be the same wall time under a larger offset, which fold=0 already is.
        return first
    # In a gap: fold=0 read it with the offset before the change (an instant after the gap),
    # fold=1 with the offset after it (an instant before the gap). The gap ends in between.
    before = _utc_seconds(wall - (wall.replace(tzinfo=zone, fold=1).utcoffset() or dt.timedelta()))
    lo, hi = min(before, first), max(before, first)
    while lo < hi:  # the first second whose wall time is >= wall
        mid = (lo + hi) // 2
        if _wall(mid, zone) >= wall:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _month_wall(year: int, month: int) -> dt.datetime:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return dt.datetime(year, month, 1)


@lru_cache(maxsize=4096)
def _calendar_boundary(kind: WindowKind, zone_name: str, index: int) -> int:
    """Start of calendar day or month number `index` (days, months since 1970-01) in the zone."""
    if kind is WindowKind.DAY:
        wall = _EPOCH + dt.timedelta(days=index)
    else:
        wall = _month_wall(1970, index + 1)
    return resolve(wall, time_zone(zone_name))


@dataclass(frozen=True)
class WindowSpec:
    """A budget's window: its kind, the zone of calendar windows, the length of a rolling one."""

    kind: WindowKind
    time_zone: str = "UTC"
    rolling_s: int | None = None  # rolling windows only: a multiple of ROLLING_BUCKETS seconds

    def __post_init__(self) -> None:
        time_zone(self.time_zone)  # raises WindowError
        if self.kind is WindowKind.ROLLING:
            n = self.rolling_s
            if n is None or not MIN_ROLLING_S <= n <= MAX_ROLLING_S or n % ROLLING_BUCKETS:
                raise WindowError(
                    f"a rolling window needs rolling_s between {MIN_ROLLING_S} and {MAX_ROLLING_S}, "
                    f"a multiple of {ROLLING_BUCKETS}; got {n}"
                )
        elif self.rolling_s is not None:
            raise WindowError(f"rolling_s is for rolling windows only, not {self.kind.value}")

    @property
    def zone(self) -> ZoneInfo:
        return time_zone(self.time_zone)

    @property
    def bucket_s(self) -> int | None:
        """The fixed length of a bucket, or None for calendar days and months (they vary)."""
        if self.kind is WindowKind.ROLLING:
            return (self.rolling_s or 0) // ROLLING_BUCKETS
        return _FIXED_S.get(self.kind)

    def _boundary(self, index: int) -> int:
        return _calendar_boundary(self.kind, self.time_zone, index)

    def _index(self, t: float) -> int:
        """The calendar day or month whose window holds `t` (boundaries are increasing)."""
        local = _wall(t, self.zone)
        if self.kind is WindowKind.DAY:
            index = (local.date() - _EPOCH.date()).days
        else:
            index = (local.year - 1970) * 12 + local.month - 1
        # The local date is not monotone in time when clocks go back across midnight; the window
        # is the one between the boundaries around t, so step to it.
        while self._boundary(index) > t:
            index -= 1
        while self._boundary(index + 1) <= t:
            index += 1
        return index

    def window(self, t: float) -> Window:
        """The calendar window (or, for rolling, the bucket) holding `t`: start <= t < end."""
        size = self.bucket_s
        if size is not None:
            start = math.floor(t) // size * size
            return Window(start, start + size)
        index = self._index(t)
        return Window(self._boundary(index), self._boundary(index + 1))

    def bucket_start(self, t: float) -> int:
        """The bucket a charge at `t` is counted in."""
        return self.window(t).start

    def counted_from(self, t: float) -> int:
        """The oldest bucket start still counted at `t` (a calendar window counts only its own)."""
        start = self.bucket_start(t)
        if self.kind is WindowKind.ROLLING:
            return start - (ROLLING_BUCKETS - 1) * (self.bucket_s or 0)
        return start

    def counted_buckets(self, t: float) -> list[tuple[int, int]]:
        """The buckets counted at `t`, oldest first, as [start, end): the calendar window itself,
        or a rolling window's `ROLLING_BUCKETS` buckets (where a new budget's past usage goes)."""
        size = self.bucket_s
        if self.kind is not WindowKind.ROLLING or size is None:
            window = self.window(t)
            return [(window.start, window.end)]
        return [
            (start, start + size) for start in range(self.counted_from(t), self.bucket_start(t) + 1, size)
        ]

    def expires_at(self, bucket_start: int) -> int:
        """When what was counted in the bucket starting at `bucket_start` stops counting."""
        if self.kind is WindowKind.ROLLING:
            return bucket_start + (self.rolling_s or 0)
        return self.window(bucket_start).end

    def reset_at(self, t: float) -> int:
        """When the window holding `t` is over (rolling: when what is counted at `t` now has all
        left the window)."""
        return self.expires_at(self.bucket_start(t))

    def describe(self) -> str:
        """A short label: `day (Europe/Paris)`, `rolling 3600s`."""
        if self.kind is WindowKind.ROLLING:
            return f"rolling {self.rolling_s}s"
        if self.kind in (WindowKind.DAY, WindowKind.MONTH):
            return f"{self.kind.value} ({self.time_zone})"
        return self.kind.value
