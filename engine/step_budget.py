"""The scheduler's per-step token budget, derived from a target step time.

A fixed `max_num_batched_tokens` cannot be right on both a GPU and a CPU: on two CPU cores a
2,048-token prefill step takes seconds, and every running request waits for it between two of
its tokens. With a target step time the budget follows from this machine's measured cost:

    step time ~ a + b * tokens            (fitted online, exponential forgetting)
    budget    = floor((target - a) / b)   clamped to [floor, max_num_batched_tokens]
    floor     = decodes this step + min_prefill_chunk (when prefill work exists)

- `a` (overhead per step: the weight read of a decode step, Python, sampling) and `b` (cost per
  token) come from a weighted least-squares fit of the observed (tokens, seconds) of past steps;
  each new step multiplies the old weights by `forgetting`, so the fit follows a machine whose
  load changes. The slope is shrunk towards its previous value (a ridge term of
  `min_prefill_chunk**2` token^2): while the recent steps all had the same size (decodes only)
  the data say nothing about `b`, and the old value stands; only `a` follows the mean.
- Before the slope is known (no two steps of different enough sizes yet) the budget probes:
  `initial_tokens`, then twice the largest step seen, up to the maximum.
- The floor means a running request always gets its decode token, and a waiting prompt always
  gets at least `min_prefill_chunk` tokens: nothing starves, whatever the target.

Without a target (`target_step_s` None) the budget is `max_num_batched_tokens`, as before; the
cost model is still fitted, for `/metrics`. Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.config import SchedulerConfig

# A slope below this (s/token) is treated as "tokens are free": the budget goes to the maximum.
_MIN_SLOPE_S = 1e-9


@dataclass(frozen=True)
class StepBudgetConfig:
    """How the per-step token budget is chosen. `target_step_s` None: the fixed `max_tokens`."""

    max_tokens: int
    target_step_s: float | None = None
    min_prefill_chunk: int = 32
    forgetting: float = 0.9  # weight kept by each past step per new step
    initial_tokens: int = 64  # the first probe, before the cost per token is known

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.target_step_s is not None and not (
            self.target_step_s > 0 and math.isfinite(self.target_step_s)
        ):
            raise ValueError(f"target_step_s must be a finite number > 0, got {self.target_step_s}")
        if self.min_prefill_chunk < 1:
            raise ValueError(f"min_prefill_chunk must be >= 1, got {self.min_prefill_chunk}")
        if not 0 < self.forgetting < 1:
            raise ValueError(f"forgetting must be in (0, 1), got {self.forgetting}")
        if self.initial_tokens < 1:
            raise ValueError(f"initial_tokens must be >= 1, got {self.initial_tokens}")


@dataclass(frozen=True)
class StepCost:
    """The fitted cost of a step: `overhead_s + per_token_s * tokens`."""

    overhead_s: float
    per_token_s: float

    def seconds(self, num_tokens: int) -> float:
        return self.overhead_s + self.per_token_s * num_tokens


class StepCostModel:
    """Online weighted least squares of step seconds on step tokens, with exponential forgetting.

    Keeps five weighted sums; `observe` is O(1). `cost` is None until two steps of different
    enough sizes have been seen (the slope is not identified before).
    """

    def __init__(self, forgetting: float, ridge: float) -> None:
        self._forgetting = forgetting
        self._ridge = ridge  # token^2; pulls the slope towards its previous value
        self._w = self._x = self._xx = self._y = self._xy = 0.0
        self._slope: float | None = None
        self.num_observed = 0
        self.max_tokens_seen = 0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Add one executed step. Steps without tokens or without a positive duration are ignored."""
        if num_tokens <= 0 or not (seconds > 0 and math.isfinite(seconds)):
            return
        f = self._forgetting
        x, y = float(num_tokens), seconds
        self._w = f * self._w + 1.0
        self._x = f * self._x + x
        self._xx = f * self._xx + x * x
        self._y = f * self._y + y
        self._xy = f * self._xy + x * y
        self.num_observed += 1
        self.max_tokens_seen = max(self.max_tokens_seen, num_tokens)
        sxx = max(0.0, self._xx - self._x * self._x / self._w)  # weighted spread of the sizes
        sxy = self._xy - self._x * self._y / self._w
        if self._slope is None:
            if sxx >= self._ridge:
                self._slope = sxy / sxx
        else:
            self._slope = (sxy + self._ridge * self._slope) / (sxx + self._ridge)

    @property
    def cost(self) -> StepCost | None:
        """The current fit, or None while the cost per token is unknown."""
        if self._slope is None:
            return None
        slope = max(self._slope, _MIN_SLOPE_S)
        overhead = max(0.0, (self._y - slope * self._x) / self._w)
        return StepCost(overhead_s=overhead, per_token_s=slope)


@dataclass(frozen=True)
class StepBudgetStats:
    """What `/metrics` shows: the last budget, the target, and the fitted cost (None: not yet known)."""

    token_budget: int
    target_step_s: float | None
    cost: StepCost | None


class StepBudget:
    """Chooses each step's token budget (see the module docstring for the rule)."""

    def __init__(self, config: StepBudgetConfig) -> None:
        self.config = config
        self.model = StepCostModel(config.forgetting, ridge=float(config.min_prefill_chunk) ** 2)
        self.last_budget = config.max_tokens

    def budget(self, num_decodes: int, has_prefill_work: bool) -> int:
        """Tokens the next step may feed: `num_decodes` running decodes, and prefill if any waits."""
        cfg = self.config
        if cfg.target_step_s is None:
            chosen = cfg.max_tokens
        else:
            floor = num_decodes + (cfg.min_prefill_chunk if has_prefill_work else 0)
            chosen = min(cfg.max_tokens, max(floor, self._fitted(cfg.target_step_s)))
        self.last_budget = chosen
        return chosen

    def _fitted(self, target_s: float) -> int:
        cost = self.model.cost
        if cost is None:  # probe: grow until two step sizes tell the slope
            return max(self.config.initial_tokens, 2 * self.model.max_tokens_seen)
        spare = target_s - cost.overhead_s
        if spare <= 0:
            return 0
        return int(min(spare / cost.per_token_s, float(self.config.max_tokens)))

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Feed back one executed step: the tokens it computed and how long it took."""
        self.model.observe(num_tokens, seconds)

    def stats(self) -> StepBudgetStats:
        return StepBudgetStats(self.last_budget, self.config.target_step_s, self.model.cost)


def make_step_budget(config: SchedulerConfig) -> StepBudget:
    """The step budget of `config`: fixed at `max_num_batched_tokens` unless a target step time is set."""
    return StepBudget(
        StepBudgetConfig(max_tokens=config.max_num_batched_tokens, target_step_s=config.target_step_s)
    )
