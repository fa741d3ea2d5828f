"""When each request is sent: the trace's own times (scaled), Poisson, or a fixed concurrency."""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weir_bench.workloads import WorkloadRequest


class ArrivalMode(enum.Enum):
    """How send times are chosen."""

    TRACE = "trace"  # the trace's `t`, divided by rate_scale (open loop)
    POISSON = "poisson"  # exponential gaps at `rate` requests/s, trace order kept (open loop)
    CONCURRENCY = (
        "concurrency"  # `concurrency` requests in flight, next one as soon as one ends (closed loop)
    )


@dataclass(frozen=True)
class ArrivalSpec:
    """The arrival process of one run."""

    mode: ArrivalMode = ArrivalMode.TRACE
    rate_scale: float = 1.0
    rate: float | None = None
    concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate_scale <= 0:
            raise ValueError("rate_scale must be > 0")
        if self.mode is ArrivalMode.POISSON and (self.rate is None or self.rate <= 0):
            raise ValueError("rate must be > 0 for Poisson arrivals")
        if self.mode is ArrivalMode.CONCURRENCY and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("concurrency must be >= 1 for fixed-concurrency arrivals")

    def describe(self) -> dict[str, Any]:
        """The parameters that matter for this mode, for report metadata."""
        if self.mode is ArrivalMode.TRACE:
            return {"mode": self.mode.value, "rate_scale": self.rate_scale}
        if self.mode is ArrivalMode.POISSON:
            return {"mode": self.mode.value, "rate": self.rate, "seed": self.seed}
        return {"mode": self.mode.value, "concurrency": self.concurrency}


def send_offsets(requests: Sequence[WorkloadRequest], spec: ArrivalSpec) -> list[float]:
    """Seconds from the start of the run at which each request (in the given order) is due.

    Only meaningful for the open-loop modes; fixed concurrency has no schedule and gets zeros.
    """
    if spec.mode is ArrivalMode.TRACE:
        return [r.t / spec.rate_scale for r in requests]
    if spec.mode is ArrivalMode.POISSON:
        rate = spec.rate or 0.0  # > 0, checked in ArrivalSpec.__post_init__
        rng = random.Random(spec.seed)
        t, out = 0.0, []
        for _ in requests:
            t += rng.expovariate(rate)
            out.append(t)
        return out
    return [0.0 for _ in requests]
