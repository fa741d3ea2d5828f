"""bench.stats: percentiles agree with numpy's default definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.stats import Distribution, LatencySummary, percentile

floats = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@settings(deadline=None)  # a shared CPU must not fail a correct test on time
@given(values=st.lists(floats, min_size=1, max_size=200), q=st.floats(0.0, 100.0))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert math.isclose(
        percentile(sorted(values), q), float(np.percentile(values, q)), rel_tol=1e-9, abs_tol=1e-6
    )


def test_summary_of_known_values_and_empty() -> None:
    s = LatencySummary.of(range(1, 101))
    assert (s.p50, s.p90, s.mean, s.count) == (50.5, 90.1, 50.5, 100)
    assert math.isclose(s.p99 or 0.0, 99.01)
    assert LatencySummary.of([]).to_json() == {"p50": None, "p90": None, "p99": None, "mean": None}
    d = Distribution.of([3, 1, 2]).to_json()
    assert (d["min"], d["max"], d["count"], d["p50"]) == (1, 3, 3, 2.0)


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q"):
        percentile([1.0], 101)
