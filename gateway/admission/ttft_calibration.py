"""Calibrating the TTFT predictions by the TTFTs the admitted requests then got.

`gateway.admission.slo.predict_ttft` is a model: planned steps, a fitted cost per token, the queue
ahead. Whatever it leaves out (several waiting prompts sharing one step's chunk, steps shorter
than their target when few rows run, a machine slower than its fit) biases it the same way for a
while; measured on SmolLM2 under the noisy-neighbour trace its predictions were ~1.5x the TTFT
the admitted chats got, and the SLO-predictive 503 refused three quarters of an interactive
tenant that the machine could have served in time (docs/benchmarks.md, issue 24).

So each admitted request's prediction is kept, and when it settles with a first token the ratio
`actual / predicted` (both from admission: the time a request spent before it, rendering,
tokenizing or compiling a grammar, is its tenant's own, not the engine's) updates an exponentially weighted mean of its logarithm, per priority class.
Predictions are multiplied by `exp(mean)` (clamped to [`MIN_FACTOR`, `MAX_FACTOR`]) once
`MIN_SAMPLES` requests of the class have reported. The loop closes on itself: predictions that
are too low admit more, the queue grows, the TTFTs that follow are longer and the factor rises.

Predictions under `MIN_PREDICTED_S` are not used (a few milliseconds against a few
milliseconds is noise, not a bias). Plain Python; one instance per admission controller.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

from engine.request import Priority
from gateway.admission.slo import TTFTPrediction

MIN_SAMPLES = 4  # reports of a class before its factor is applied
ALPHA = 0.2  # weight of each new report in the running mean of log(actual / predicted)
MIN_FACTOR = 0.5  # a lagging factor must not double what is admitted in a burst
MAX_FACTOR = 2.0
MIN_PREDICTED_S = 0.05


@dataclass(frozen=True)
class CalibrationState:
    """One class's calibration: the factor predictions are multiplied by, and its reports."""

    factor: float
    samples: int


class TTFTCalibration:
    """Per priority class: how much the TTFT predictions over- or under-estimate (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # settlements may come from any thread
        self._log_ratio = [0.0] * len(Priority)
        self._samples = [0] * len(Priority)

    def observe(self, priority: Priority, predicted_s: float, actual_s: float) -> None:
        """One admitted request of `priority`, predicted at `predicted_s`, got its first token after `actual_s`."""
        if not (predicted_s >= MIN_PREDICTED_S and actual_s > 0 and math.isfinite(predicted_s + actual_s)):
            return
        ratio = min(max(actual_s / predicted_s, MIN_FACTOR), MAX_FACTOR)
        i = int(priority)
        with self._lock:
            if self._samples[i] == 0:
                self._log_ratio[i] = math.log(ratio)
            else:
                self._log_ratio[i] += ALPHA * (math.log(ratio) - self._log_ratio[i])
            self._samples[i] += 1

    def state(self, priority: Priority) -> CalibrationState:
        """The factor applied to `priority`'s predictions now (1.0 until `MIN_SAMPLES` reports)."""
        i = int(priority)
        with self._lock:
            samples, log_ratio = self._samples[i], self._log_ratio[i]
        factor = math.exp(log_ratio) if samples >= MIN_SAMPLES else 1.0
        return CalibrationState(min(max(factor, MIN_FACTOR), MAX_FACTOR), samples)

    def apply(self, priority: Priority, prediction: TTFTPrediction) -> TTFTPrediction:
        """`prediction` scaled by its class's factor."""
        factor = self.state(priority).factor
        return prediction if factor == 1.0 else replace(prediction, seconds=prediction.seconds * factor)
