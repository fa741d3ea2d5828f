"""Percentile summaries over the standard library's `statistics` (no numpy needed by the load generator)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def _p50_p90_p99(data: Sequence[float]) -> tuple[float, float, float]:
    """p50, p90 and p99 of non-empty data, linear between closest ranks.

    `statistics.quantiles(method="inclusive")` is numpy's default ("linear") definition, so figures
    compare with other tools'. It wants two points; one point is every percentile of itself.
    """
    if len(data) == 1:
        only = float(data[0])
        return only, only, only
    cuts = statistics.quantiles(data, n=100, method="inclusive")  # cuts[k - 1] is the k-th percentile
    return cuts[49], cuts[89], cuts[98]


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
        p50, p90, p99 = _p50_p90_p99(data)
        return cls(p50=p50, p90=p90, p99=p99, mean=statistics.fmean(data), count=len(data))

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
        p50, p90, p99 = _p50_p90_p99(data)
        return cls(
            count=len(data), min=data[0], p50=p50, p90=p90, p99=p99, max=data[-1], mean=statistics.fmean(data)
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


def ratio(value: float, base: float, significant: int = 3) -> float | None:
    """`value / base` to `significant` digits (fixed decimals rounded small real ratios to 0.0);
    None where the base took no measurable time: some hosts count thread CPU time in ticks, so a
    short block can read 0 (CI saw it)."""
    return float(f"{value / base:.{significant}g}") if base > 0 else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
