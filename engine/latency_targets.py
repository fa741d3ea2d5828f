"""Latency targets: how soon a request's first token is due (TTFT) and how far apart the next ones
may be (ITL), per priority class, overridden per tenant by its quota's SLOs.

Defaults per class and device (None: no target; the request takes what the machine gives):

    class         CPU TTFT / ITL     GPU TTFT / ITL
    interactive   2 s   / 100 ms     500 ms / 50 ms
    standard      10 s  / 800 ms     2 s    / 100 ms
    batch         none  / none       none   / none

The CPU interactive TTFT is the noisy-neighbour experiment's objective (issue 24), whose ITL
objective is 300 ms: the target is a third of that, so that the steps of interactive work leave
room for the tail (the p99) and its chats end sooner, which keeps a tenant's bursts within its
concurrency (docs/decisions.md has the runs at 300, 200, 150 and 100 ms). The standard
ITL is the CPU's throughput-optimal step (`CPU_TARGET_STEP_MS`), so standard work alone runs
steps as large as before. A tenant's `ttft_slo_ms` / `tpot_slo_ms` replace its class defaults.

The gateway puts the tenant's overrides on `EngineRequest.latency` (fields left None take the
class default); the scheduler resolves them against its `ClassTargets` when the request is
queued (`Request.latency` is then complete). Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyTargets:
    """A TTFT and an ITL target in seconds; None: none (or, on an override: the class default)."""

    ttft_s: float | None = None
    itl_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value}")

    def over(self, default: LatencyTargets) -> LatencyTargets:
        """These targets, each missing one taken from `default`."""
        return LatencyTargets(
            self.ttft_s if self.ttft_s is not None else default.ttft_s,
            self.itl_s if self.itl_s is not None else default.itl_s,
        )

    @classmethod
    def from_slo_ms(cls, ttft_slo_ms: int | None, tpot_slo_ms: int | None) -> LatencyTargets:
        """A tenant's quota objectives (milliseconds) as an override; none (or not > 0): the class's."""
        return cls(
            ttft_slo_ms / 1000 if ttft_slo_ms is not None and ttft_slo_ms > 0 else None,
            tpot_slo_ms / 1000 if tpot_slo_ms is not None and tpot_slo_ms > 0 else None,
        )


NO_TARGETS = LatencyTargets()


@dataclass(frozen=True)
class ClassTargets:
    """The default targets of each priority class."""

    interactive: LatencyTargets
    standard: LatencyTargets
    batch: LatencyTargets

    def of(self, priority: int) -> LatencyTargets:
        """The targets of a class (`weir.engine.request.Priority`, an int: that module imports this one)."""
        return (self.interactive, self.standard, self.batch)[int(priority)]

    def resolve(self, priority: int, override: LatencyTargets) -> LatencyTargets:
        """A request's targets: its tenant's override over its class default."""
        return override.over(self.of(priority))


NO_CLASS_TARGETS = ClassTargets(NO_TARGETS, NO_TARGETS, NO_TARGETS)
CPU_CLASS_TARGETS = ClassTargets(
    interactive=LatencyTargets(ttft_s=2.0, itl_s=0.10),
    standard=LatencyTargets(ttft_s=10.0, itl_s=0.8),
    batch=NO_TARGETS,
)
GPU_CLASS_TARGETS = ClassTargets(
    interactive=LatencyTargets(ttft_s=0.5, itl_s=0.05),
    standard=LatencyTargets(ttft_s=2.0, itl_s=0.1),
    batch=NO_TARGETS,
)


def class_targets_for(device: str) -> ClassTargets:
    """The class defaults of a device: the CPU's on "cpu", the GPU's on any accelerator."""
    return CPU_CLASS_TARGETS if device == "cpu" else GPU_CLASS_TARGETS
