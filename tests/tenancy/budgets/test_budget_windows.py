"""Budget windows: hypothesis properties over month ends, leap years, time zones and DST changes."""

from __future__ import annotations

import calendar
import datetime as dt
from fractions import Fraction

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from weir.tenancy.budgets.budget_windows import (
    ROLLING_BUCKETS,
    WindowError,
    WindowKind,
    WindowSpec,
    resolve,
    time_zone,
)

# Zones with the awkward cases: DST in both hemispheres, a 30-minute DST (Lord Howe), half- and
# quarter-hour offsets, a zone that skipped a whole day (Apia, 2011-12-30), zones whose DST changes
# happen at midnight (Santiago, Havana, Beirut), and a negative-DST zone (Dublin).
ZONES = (
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Dublin",
    "Australia/Lord_Howe",
    "Australia/Adelaide",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "America/St_Johns",
    "Pacific/Apia",
    "America/Santiago",
    "America/Havana",
    "Asia/Beirut",
    "Pacific/Chatham",
)

T_MIN = -2_000_000_000  # 1906
T_MAX = 4_200_000_000  # 2103
times = st.floats(min_value=T_MIN, max_value=T_MAX, allow_nan=False, allow_infinity=False)
calendar_specs = st.builds(
    WindowSpec, kind=st.sampled_from([WindowKind.DAY, WindowKind.MONTH]), time_zone=st.sampled_from(ZONES)
)
fixed_specs = st.builds(WindowSpec, kind=st.sampled_from([WindowKind.MINUTE, WindowKind.HOUR]))
rolling_specs = st.builds(
    WindowSpec,
    kind=st.just(WindowKind.ROLLING),
    rolling_s=st.integers(1, 366 * 1440).map(lambda n: n * ROLLING_BUCKETS),
)
any_spec = st.one_of(calendar_specs, fixed_specs, rolling_specs)


@settings(max_examples=400, deadline=None)
@given(spec=any_spec, t=times)
def test_the_window_holds_t_and_consecutive_windows_tile_time(spec: WindowSpec, t: float) -> None:
    w = spec.window(t)
    assert w.start <= t < w.end
    # The next window starts where this one ends, and the one before ends where this one starts:
    # no gap, no overlap.
    assert spec.window(w.end).start == w.end
    assert spec.window(w.start - 1).end == w.start
    assert spec.window(w.start) == w
    assert spec.window(w.end - 1) == w


@settings(max_examples=300, deadline=None)
@given(spec=calendar_specs, t=times)
def test_the_reset_is_the_next_window_start(spec: WindowSpec, t: float) -> None:
    reset = spec.reset_at(t)
    assert reset > t
    assert spec.bucket_start(reset) == reset
    assert spec.counted_from(t) == spec.bucket_start(t) <= t
    # Every instant up to the reset is in the same window; the reset is in the next one.
    assert spec.bucket_start(reset - 1) == spec.bucket_start(t)


@settings(max_examples=300, deadline=None)
@given(spec=calendar_specs, t=times)
def test_calendar_windows_start_at_local_midnight_when_it_exists(spec: WindowSpec, t: float) -> None:
    zone = spec.zone
    start = spec.bucket_start(t)
    local = dt.datetime.fromtimestamp(start, zone)
    before = dt.datetime.fromtimestamp(start - 1, zone).replace(tzinfo=None)
    wall = local.replace(tzinfo=None)
    # Either the window starts at local midnight (of the first of the month) ...
    at_midnight = wall.time() == dt.time(0) and (spec.kind is WindowKind.DAY or wall.day == 1)
    # ... or that midnight fell in a gap and the window starts where the gap ends: the second
    # before is on an earlier date, the start is past midnight.
    assert at_midnight or before.date() < wall.date()
    length_h = (spec.reset_at(t) - start) / 3600
    if spec.kind is WindowKind.DAY:
        assert 0 < length_h <= 48  # 23 or 25 around DST; Apia's skipped day folds into the next
    else:
        assert 27 * 24 <= length_h <= 32 * 24


@settings(max_examples=200, deadline=None)
@given(year=st.integers(1910, 2100), month=st.integers(1, 12))
def test_utc_months_have_their_calendar_length_leap_years_included(year: int, month: int) -> None:
    spec = WindowSpec(WindowKind.MONTH)
    first = calendar.timegm((year, month, 1, 0, 0, 0))
    w = spec.window(first + 86_400 * 20)
    assert w.start == first
    assert (w.end - w.start) // 86_400 == calendar.monthrange(year, month)[1]
    if month == 2:
        assert (w.end - w.start == 29 * 86_400) == calendar.isleap(year)


@settings(max_examples=200, deadline=None)
@given(t=times)
def test_utc_days_are_86400_seconds_at_utc_midnight(t: float) -> None:
    w = WindowSpec(WindowKind.DAY).window(t)
    assert w.start % 86_400 == 0 and w.end - w.start == 86_400


@settings(max_examples=200, deadline=None)
@given(spec=rolling_specs, t0=times, later=st.floats(0, 400 * 86_400))
def test_a_rolling_charge_counts_for_the_window_less_at_most_one_bucket(
    spec: WindowSpec, t0: float, later: float
) -> None:
    size = spec.bucket_s
    assert size is not None and spec.rolling_s == size * ROLLING_BUCKETS
    b = spec.bucket_start(t0)
    t = t0 + later
    counted = spec.counted_from(t) <= b <= spec.bucket_start(t)
    assert counted == (t < spec.expires_at(b))
    # Exact arithmetic: a float subtraction would round a tiny t0 away.
    assert spec.rolling_s - size < spec.expires_at(b) - Fraction(t0) <= spec.rolling_s


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("America/New_York", "2024-03-10", 23),
        ("America/New_York", "2024-11-03", 25),
        ("Europe/London", "2024-03-31", 23),
        ("Europe/London", "2024-10-27", 25),
        ("Australia/Lord_Howe", "2024-04-07", 24.5),
        ("Australia/Lord_Howe", "2024-10-06", 23.5),
        ("Asia/Kolkata", "2024-03-10", 24),
        ("Pacific/Apia", "2011-12-31", 24),
    ],
)
def test_dst_days(zone: str, day: str, hours: float) -> None:
    tz = time_zone(zone)
    noon = dt.datetime.fromisoformat(day).replace(hour=12, tzinfo=tz).timestamp()
    w = WindowSpec(WindowKind.DAY, zone).window(noon)
    assert (w.end - w.start) / 3600 == hours
    assert dt.datetime.fromtimestamp(w.start, tz).replace(tzinfo=None) == dt.datetime.fromisoformat(day)


def test_apia_skipped_day_is_not_a_window() -> None:
    """Samoa went from 2011-12-29 straight to 2011-12-31: the 29th ends where the 31st begins."""
    tz = time_zone("Pacific/Apia")
    spec = WindowSpec(WindowKind.DAY, "Pacific/Apia")
    late_29th = dt.datetime(2011, 12, 29, 23, 0, tzinfo=tz).timestamp()
    w = spec.window(late_29th)
    assert dt.datetime.fromtimestamp(w.end, tz).replace(tzinfo=None) == dt.datetime(2011, 12, 31)


def test_a_midnight_in_a_gap_starts_the_day_when_the_gap_ends() -> None:
    """Santiago sprang forward at 2023-09-03 00:00 to 01:00: that day starts at 01:00 local."""
    tz = time_zone("America/Santiago")
    start = resolve(dt.datetime(2023, 9, 3), tz)
    assert dt.datetime.fromtimestamp(start, tz).replace(tzinfo=None) == dt.datetime(2023, 9, 3, 1)
    assert dt.datetime.fromtimestamp(start - 1, tz).replace(tzinfo=None) == dt.datetime(
        2023, 9, 2, 23, 59, 59
    )


def test_a_wall_time_that_occurs_twice_resolves_to_the_first() -> None:
    tz = time_zone("America/New_York")
    first = resolve(dt.datetime(2024, 11, 3, 1, 30), tz)
    assert first == dt.datetime(2024, 11, 3, 5, 30, tzinfo=dt.UTC).timestamp()


def test_month_in_a_time_zone() -> None:
    spec = WindowSpec(WindowKind.MONTH, "Asia/Kolkata")
    w = spec.window(dt.datetime(2024, 2, 29, 20, 0, tzinfo=dt.UTC).timestamp())  # 1 March 01:30 IST
    assert w.start == dt.datetime(2024, 2, 29, 18, 30, tzinfo=dt.UTC).timestamp()
    assert (w.end - w.start) == 31 * 86_400


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": WindowKind.DAY, "time_zone": "Mars/Olympus"},
        {"kind": WindowKind.DAY, "time_zone": "../../etc/passwd"},
        {"kind": WindowKind.DAY, "time_zone": ""},
        {"kind": WindowKind.ROLLING},
        {"kind": WindowKind.ROLLING, "rolling_s": 61},
        {"kind": WindowKind.ROLLING, "rolling_s": 0},
        {"kind": WindowKind.ROLLING, "rolling_s": 10**12},
        {"kind": WindowKind.HOUR, "rolling_s": 3600},
    ],
)
def test_bad_windows_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(WindowError):
        WindowSpec(**kwargs)  # type: ignore[arg-type]


def test_describe() -> None:
    assert WindowSpec(WindowKind.DAY, "Europe/Paris").describe() == "day (Europe/Paris)"
    assert WindowSpec(WindowKind.ROLLING, rolling_s=3600).describe() == "rolling 3600s"
    assert WindowSpec(WindowKind.MINUTE).describe() == "minute"


@settings(max_examples=300, deadline=None)
@given(spec=any_spec, t=times, u=st.floats(min_value=-2 * 366 * 86_400, max_value=0))
def test_the_counted_buckets_tile_what_is_counted_at_t(spec: WindowSpec, t: float, u: float) -> None:
    """A new budget's past usage goes in `counted_buckets(t)`: contiguous, from `counted_from(t)`
    to the end of t's bucket, each keyed where a charge at its times is added, and a time
    `t + u` (in the past) falls in one of them exactly when its bucket is counted at t."""
    buckets = spec.counted_buckets(t)
    assert buckets[0][0] == spec.counted_from(t) and buckets[-1][0] == spec.bucket_start(t)
    assert buckets[-1][1] == spec.window(t).end and buckets[-1][0] <= t < buckets[-1][1]
    assert len(buckets) == (ROLLING_BUCKETS if spec.kind is WindowKind.ROLLING else 1)
    for (start, end), (after, _) in zip(buckets, buckets[1:], strict=False):
        assert start < end == after
    for start, end in buckets:
        assert spec.bucket_start(start) == start and spec.bucket_start(end - 1) == start
    past = t + u
    held = [start for start, end in buckets if start <= past < end]
    counted = spec.counted_from(t) <= spec.bucket_start(past) <= spec.bucket_start(t)
    assert held == ([spec.bucket_start(past)] if counted else [])
