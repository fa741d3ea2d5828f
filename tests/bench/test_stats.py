"""weir_bench.stats: percentiles and means agree with numpy's default definitions."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from weir_bench.stats import Distribution, LatencySummary, ratio

floats = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@settings(deadline=None)  # a shared CPU must not fail a correct test on time
@given(values=st.lists(floats, min_size=1, max_size=200))
def test_summaries_match_numpy(values: list[float]) -> None:
    s = LatencySummary.of(reversed(values))  # any order
    d = Distribution.of(values)
    for q, got in ((50, s.p50), (90, s.p90), (99, s.p99), (50, d.p50), (90, d.p90), (99, d.p99)):
        assert _close(got, float(np.percentile(values, q))), (q, got)
    assert _close(s.mean, float(np.mean(values))) and _close(d.mean, float(np.mean(values)))
    assert (s.count, d.count, d.min, d.max) == (len(values), len(values), min(values), max(values))


def test_summary_of_known_values_and_empty() -> None:
    s = LatencySummary.of(range(1, 101))
    assert (s.p50, s.p90, s.mean, s.count) == (50.5, 90.1, 50.5, 100)
    assert math.isclose(s.p99 or 0.0, 99.01)
    assert LatencySummary.of([]).to_json() == {"p50": None, "p90": None, "p99": None, "mean": None}
    d = Distribution.of([3, 1, 2]).to_json()
    assert (d["min"], d["max"], d["count"], d["p50"]) == (1, 3, 3, 2.0)
    assert Distribution.of([]).to_json()["p50"] is None


def test_one_value_is_every_percentile() -> None:
    s = LatencySummary.of([7])
    assert s.to_json() == {"p50": 7.0, "p90": 7.0, "p99": 7.0, "mean": 7.0} and s.count == 1


def test_a_ratio_keeps_three_significant_digits_and_refuses_a_zero_base() -> None:
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(0.002, 3.0) == 0.000667  # two decimals would have read 0.0
    assert ratio(0.0, 2.0) == 0.0
    assert ratio(0.5, 0.0) is None  # a block that took no measurable CPU time
