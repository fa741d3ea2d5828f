"""The rates the engine measures of its own steps: prefill tokens per second, decode steps per second.

Each model-runner step feeds either prompt tokens (a prefill step: the rate is its prompt tokens
over its seconds) or decodes only (the rate is steps per second); both are exponential moving
averages. They serve `/metrics` and the gateway's TTFT prediction (`EngineStats`), the swap or
recompute choice (`weir.engine.kv.swap_policy`, read at each preemption) and, through
`prefill_seconds`, the store tier's fetch-or-recompute choice.

`forget` starts both afresh: the start-up warm-up's 8-token prompt runs at ~70 tokens/s where a
128-token chunk runs at ~600, and admission would judge the first requests by it. Plain Python,
no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from weir.engine.scheduling.step_budget import StepBudget


@dataclass
class RateMeter:
    """Exponential moving average of a rate (units per second)."""

    alpha: float = 0.2
    value: float = 0.0
    samples: int = field(default=0)

    def add(self, units: float, seconds: float) -> None:
        if seconds <= 0 or units <= 0:
            return
        rate = units / seconds
        self.value = rate if self.samples == 0 else (1 - self.alpha) * self.value + self.alpha * rate
        self.samples += 1


class MeasuredRates:
    """The engine's prefill and decode rates; outlives the scheduler (reset keeps them)."""

    def __init__(self, step_budget: StepBudget) -> None:
        self._step_budget = step_budget
        self.prefill = RateMeter()  # prompt tokens per second of prefill steps
        self.decode = RateMeter()  # decode-only steps per second

    def observe(self, num_prefill_tokens: int, seconds: float) -> None:
        """One model-runner step ran in `seconds`, feeding `num_prefill_tokens` prompt tokens
        (0: a decode-only step)."""
        if num_prefill_tokens:
            self.prefill.add(num_prefill_tokens, seconds)
        else:
            self.decode.add(1, seconds)

    def forget(self) -> None:
        """Start both rates afresh (after the start-up warm-up, see the module docstring)."""
        self.prefill = RateMeter()
        self.decode = RateMeter()

    def prefill_seconds(self, num_tokens: int) -> float:
        """The estimated time to prefill `num_tokens` tokens now: the step budget's fitted cost, else
        the measured prefill rate; 0 before either is known."""
        fitted = self._step_budget.fitted_seconds(num_tokens)
        if fitted > 0:
            return fitted
        rate = self.prefill.value
        return num_tokens / rate if rate > 0 else 0.0
