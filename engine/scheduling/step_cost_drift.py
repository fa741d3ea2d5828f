"""Detecting that the fitted step cost no longer describes the machine (issue 58).

The step cost model (engine/scheduling/step_cost_model.py) forgets old steps exponentially and pulls its slopes
towards their last values, so that steps which all have the same shape (eight decode rows, a
32-token chunk) do not move a slope they say nothing about. The price: a fit made while the
machine was contended (a neighbour process, a load generator starting, a server start-up) keeps
its slopes after the contention ends. Only the overhead follows the mean, and the plan built on
the slopes (how many rows a step holds, how many may run, how long a prefill chunk takes) stays
pinned for the rest of the run: measured, every first token 15-24 s late while the streams that
did run got a token every 50 ms against a 100 ms target.

A neighbour slows every part of a step by about the same factor, so the drift shows as steps
that keep taking a different time than the fit predicted them in the same direction:
`DRIFT_STEPS` steps in a row each off by more than `DRIFT_TOLERANCE` (relative, all slower or
all faster). Noise does not do that (it changes sign), and a lone stall is one step. When it
happens the detector hands back the `Drift`: the factor (geometric mean of actual / predicted
over those steps) and the steps themselves. The model then refits from them alone, its slopes
pulled towards the old ones times the factor (`StepCostModel.observe`), logs one line and
counts the refit (`/metrics`: `weir_scheduler_step_fit_refits_total`).

Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DRIFT_TOLERANCE = 0.15  # a step more than this far from its prediction (relative) counts
DRIFT_STEPS = 4  # this many in a row, all in the same direction: the fit drifted


@dataclass(frozen=True)
class ObservedStep:
    """One executed step: its features (1, decode rows, prefill tokens, context in thousands)."""

    features: tuple[float, ...]
    seconds: float


@dataclass(frozen=True)
class Drift:
    """Steps that all ran slower (factor > 1) or faster (< 1) than the fit predicted."""

    factor: float  # geometric mean of actual / predicted over `steps`
    steps: tuple[ObservedStep, ...]  # oldest first, the step that completed the run last


class DriftDetector:
    """Counts the steps in a row that ran off their prediction in the same direction."""

    def __init__(self, tolerance: float = DRIFT_TOLERANCE, run: int = DRIFT_STEPS) -> None:
        if not tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        if run < 2:
            raise ValueError(f"run must be >= 2, got {run}")
        self._tolerance = tolerance
        self._run = run
        self._direction = 0  # +1: slower than predicted, -1: faster, 0: within tolerance
        self._steps: list[ObservedStep] = []
        self._log_ratios: list[float] = []

    def observe(self, step: ObservedStep, predicted_s: float) -> Drift | None:
        """Add a step the current fit predicted at `predicted_s`; the drift once the run is complete
        (the run starts over after it)."""
        if not (predicted_s > 0 and step.seconds > 0 and math.isfinite(predicted_s + step.seconds)):
            return None
        ratio = step.seconds / predicted_s
        if not 0 < ratio < math.inf:  # a subnormal time over a large prediction underflows to 0
            return None
        direction = 1 if ratio > 1 + self._tolerance else -1 if ratio < 1 - self._tolerance else 0
        if direction == 0 or direction != self._direction:
            self.clear()
            if direction == 0:
                return None
            self._direction = direction
        self._steps.append(step)
        self._log_ratios.append(math.log(ratio))
        if len(self._steps) < self._run:
            return None
        drift = Drift(math.exp(sum(self._log_ratios) / len(self._log_ratios)), tuple(self._steps))
        self.clear()
        return drift

    def clear(self) -> None:
        """Start counting again (the fit changed)."""
        self._direction = 0
        self._steps = []
        self._log_ratios = []
