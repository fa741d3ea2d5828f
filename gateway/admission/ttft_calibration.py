"""Calibrating the TTFT predictions by the TTFTs the admitted requests then got.

`weir.gateway.admission.slo.predict_ttft` is a model: planned steps, a fitted cost per token, the queue
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

Tenants are kept apart where it matters: a tenant's predictions are scaled by its own factor once
it has `MIN_SAMPLES` reports of its class, and until then by its class's factor only where that
makes them shorter (at most 1). So one tenant whose first tokens come late (prompts the model
under-predicts, a stream it holds back) can make only its own predictions, and 503s, stricter,
never another tenant's; the class's lessons that a prediction runs long still help a tenant's
first requests. At most `MAX_TENANTS` tenants are remembered (least recently reporting first out).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

from cachetools import LRUCache

from weir.engine.request import Priority
from weir.gateway.admission.slo import TTFTPrediction

MIN_SAMPLES = 4  # reports of a class before its factor is applied
ALPHA = 0.2  # weight of each new report in the running mean of log(actual / predicted)
MIN_FACTOR = 0.5  # a lagging factor must not double what is admitted in a burst
MAX_FACTOR = 2.0
MIN_PREDICTED_S = 0.05
MAX_TENANTS = 10_000  # (class, tenant) means kept; each is two numbers


@dataclass(frozen=True)
class CalibrationState:
    """One class's calibration: the factor predictions are multiplied by, and its reports."""

    factor: float
    samples: int


class _LogRatioMean:
    """An exponentially weighted mean of log(actual / predicted) and how many reports made it."""

    __slots__ = ("log_ratio", "samples")

    def __init__(self) -> None:
        self.log_ratio = 0.0
        self.samples = 0

    def add(self, ratio: float) -> None:
        if self.samples == 0:
            self.log_ratio = math.log(ratio)
        else:
            self.log_ratio += ALPHA * (math.log(ratio) - self.log_ratio)
        self.samples += 1

    def state(self) -> CalibrationState:
        factor = math.exp(self.log_ratio) if self.samples >= MIN_SAMPLES else 1.0
        return CalibrationState(min(max(factor, MIN_FACTOR), MAX_FACTOR), self.samples)


class TTFTCalibration:
    """Per priority class and per tenant: how much the TTFT predictions over- or under-estimate
    (module docstring)."""

    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self._lock = threading.Lock()  # settlements may come from any thread
        self._classes = [_LogRatioMean() for _ in Priority]
        self._tenants: LRUCache[tuple[int, str], _LogRatioMean] = LRUCache(maxsize=max_tenants)

    def observe(
        self, priority: Priority, predicted_s: float, actual_s: float, tenant: str | None = None
    ) -> None:
        """One admitted request of `priority` (of `tenant`), predicted at `predicted_s`, got its
        first token after `actual_s`."""
        if not (predicted_s >= MIN_PREDICTED_S and actual_s > 0 and math.isfinite(predicted_s + actual_s)):
            return
        ratio = min(max(actual_s / predicted_s, MIN_FACTOR), MAX_FACTOR)
        i = int(priority)
        with self._lock:
            self._classes[i].add(ratio)
            if tenant is not None:
                own = self._tenants.get((i, tenant))
                if own is None:
                    own = self._tenants[(i, tenant)] = _LogRatioMean()
                own.add(ratio)

    def state(self, priority: Priority, tenant: str | None = None) -> CalibrationState:
        """The factor applied to `priority`'s predictions now: the class's (1.0 until
        `MIN_SAMPLES` reports); for `tenant`, its own once it has as many reports, else the
        class's at most 1."""
        i = int(priority)
        with self._lock:
            cls = self._classes[i].state()
            own = self._tenants.get((i, tenant)) if tenant is not None else None
            mine = own.state() if own is not None else None
        if tenant is None:
            return cls
        if mine is not None and mine.samples >= MIN_SAMPLES:
            return mine
        return CalibrationState(min(cls.factor, 1.0), mine.samples if mine is not None else 0)

    def apply(
        self, priority: Priority, prediction: TTFTPrediction, tenant: str | None = None
    ) -> TTFTPrediction:
        """`prediction` scaled by its factor (`state`)."""
        factor = self.state(priority, tenant).factor
        return prediction if factor == 1.0 else replace(prediction, seconds=prediction.seconds * factor)
