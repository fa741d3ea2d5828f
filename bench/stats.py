"""Percentiles and summaries, in plain Python (no numpy needed by the load generator)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linear between closest ranks.

    Same definition as numpy's default ("linear"), so figures compare with other tools'.
    """
    if not sorted_values:
        raise ValueError("sorted_values must not be empty")
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be in [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass(frozen=True)
class LatencySummary:
    """p50/p90/p99 and mean of one latency, in ms; all None when nothing was measured."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> LatencySummary:
        """Summarize the values (any order)."""
        data = sorted(values)
        if not data:
            return cls(None, None, None, None, 0)
        return cls(
            p50=percentile(data, 50),
            p90=percentile(data, 90),
            p99=percentile(data, 99),
            mean=math.fsum(data) / len(data),
            count=len(data),
        )

    def to_json(self, digits: int = 3) -> dict[str, float | None]:
        """The report's `{"p50", "p90", "p99", "mean"}` object."""
        return {
            "p50": _round(self.p50, digits),
            "p90": _round(self.p90, digits),
            "p99": _round(self.p99, digits),
            "mean": _round(self.mean, digits),
        }


@dataclass(frozen=True)
class Distribution:
    """Shape of a length distribution (prompt or output tokens) for report metadata."""

    count: int
    min: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        """Summarize the values (any order)."""
        data = sorted(values)
        if not data:
            return cls(0, None, None, None, None, None, None)
        return cls(
            count=len(data),
            min=data[0],
            p50=percentile(data, 50),
            p90=percentile(data, 90),
            p99=percentile(data, 99),
            max=data[-1],
            mean=math.fsum(data) / len(data),
        )

    def to_json(self, digits: int = 2) -> dict[str, float | int | None]:
        """A JSON object with every field."""
        return {
            "count": self.count,
            "min": _round(self.min, digits),
            "p50": _round(self.p50, digits),
            "p90": _round(self.p90, digits),
            "p99": _round(self.p99, digits),
            "max": _round(self.max, digits),
            "mean": _round(self.mean, digits),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
