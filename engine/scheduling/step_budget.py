"""The scheduler's per-step token budget and running cap, derived from a target step time.

A fixed `max_num_batched_tokens` cannot be right on both a GPU and a CPU: on two CPU cores a
2,048-token prefill step takes seconds, and every running request waits for it between two of
its tokens. With a target step time the budget follows from this machine's measured cost:

    step time ~ a + c * decodes + k * decode context + b * prefill tokens
                                                       (fitted online, exponential forgetting)
    budget    = decodes + floor((target - a - c * decodes) / b)
                clamped to [floor, max_num_batched_tokens]
    floor     = decodes this step + chunk (when prefill work exists)
    chunk     = min(min_prefill_chunk, max(1, floor((target - a) / 4 / b)))
    running  <= max(1, floor((target - a - b * chunk) / c))   (admission cap)

- `a` (overhead per step: the weight read, Python, sampling), `c` (one decode row), `k` (one
  context token a decode row attends over) and `b` (one prefill token) are the step cost model's
  fit (engine/scheduling/step_cost_model.py: weighted least squares with forgetting, the slopes
  pulled towards their previous values, the fit dropped when it over-predicts and refitted
  when it drifts).
- The admission cap: decodes alone can overrun the target (64 running chats on two cores take
  ~0.5 s a step), and no token budget can shorten a step below its decodes. So a sequence is
  admitted only while a step of every running decode plus the minimum prefill chunk fits the
  target; past that, requests wait in the queue (TTFT) instead of slowing every running stream
  (ITL). One sequence always runs, whatever the target.
- The margin: the fit predicts a step's mean time, but the target is a bound every step should
  keep. The budget and the cap plan for `target / (1 + margin)`, the margin being twice the
  recent RMS overrun (actual / predicted - 1 when positive), at most 25%: a machine whose steps
  vary more gets smaller steps. A steady machine (±3% jitter) plans ~3% under the target.
- Before the slope is known (no two steps of different enough sizes yet) the budget probes:
  `initial_tokens`, then twice the largest step seen, up to the maximum; nothing is capped.
  After, the budget still never exceeds twice the largest step measured: a fit whose slope
  dropped towards zero would otherwise jump to the maximum, a step of seconds on a CPU.
- The floor means a running request always gets its decode token, and a waiting prompt always
  gets at least `min_prefill_chunk` tokens, or, where that many tokens take more than a quarter
  of what the target leaves after the overhead (a slow or loaded CPU under a 300 ms interactive
  target: 32 tokens at 11 ms each are 352 ms), as many as fit that quarter, at least one:
  nothing starves, and the minimum chunk does not by itself break the ITL a step owes. (Where
  the overhead alone is longer than the target no step keeps it, and the whole chunk stands.)

Without a target (`target_step_s` None) the budget is `max_num_batched_tokens` and nothing is
capped, as before; the cost model is still fitted, for `/metrics`. Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from weir.engine.config import SchedulerConfig
from weir.engine.scheduling.step_cost_model import MIN_SLOPE_S, StepCost, StepCostModel

_MAX_MARGIN = 0.25  # the budget plans for at least target / 1.25
_MISS_FORGETTING = 0.95  # weight kept by each past step's miss per new step


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
class StepBudgetStats:
    """What `/metrics` shows: the last budget, the target, the running cap (None: none) and the
    fitted cost (None: not yet known)."""

    token_budget: int
    target_step_s: float | None
    cost: StepCost | None
    max_running: int | None = None
    margin: float = 0.0
    step_target_s: float | None = None  # the last step's own target (tightest ITL running), if any
    num_fit_resets: int = 0  # fits dropped for over-predicting (`StepCostModel`)
    num_fit_refits: int = 0  # fits refitted after their steps drifted (engine/scheduling/step_cost_drift.py)
    num_stretched_steps: int = (
        0  # steps planned past the tightest ITL for first tokens (engine/scheduling/slo_trade.py)
    )


def min_chunk(min_prefill_chunk: int, planned_s: float, overhead_s: float, per_token_s: float) -> int:
    """The prefill floor of a step planned at `planned_s`: `min_prefill_chunk` tokens, or as many
    as a quarter of the time left after the overhead holds when that is fewer (at least one). A
    target no step can keep (the overhead alone is longer) keeps the whole chunk: progress first."""
    if per_token_s <= MIN_SLOPE_S or planned_s <= overhead_s:
        return min_prefill_chunk
    quarter = max(0.0, planned_s - overhead_s) / 4.0
    return max(1, min(min_prefill_chunk, int(min(quarter / per_token_s, 1 << 30))))


class StepBudget:
    """Chooses each step's token budget and whether one more sequence may run (module docstring)."""

    def __init__(self, config: StepBudgetConfig) -> None:
        self.config = config
        self.model = StepCostModel(config.forgetting, ridge=float(config.min_prefill_chunk) ** 2)
        self.last_budget = config.max_tokens
        self.last_target_s: float | None = config.target_step_s  # the last step's time target
        self.mean_decode_context = 0.0  # context tokens per decode row, moving average
        self._held_cap: int | None = None  # the running cap, moved only past its hysteresis band
        self.num_stretched_steps = (
            0  # steps the scheduler planned past the tightest ITL (engine/scheduling/slo_trade.py)
        )
        self._miss_sq = 0.0  # exponentially weighted sum of max(0, actual / predicted - 1)^2
        self._miss_w = 0.0

    @property
    def margin(self) -> float:
        """How much slower than predicted a step may run: twice the recent relative overrun (RMS),
        at most `_MAX_MARGIN`. The budget plans for `target / (1 + margin)`, so that a step that
        runs slow by the usual spread still ends within the target."""
        if self._miss_w <= 0:
            return 0.0
        return min(_MAX_MARGIN, 2.0 * math.sqrt(self._miss_sq / self._miss_w))

    def prefill_floor(self, planned_s: float) -> int:
        """The prefill floor of a step planned at `planned_s` (`min_chunk`, by the fitted cost)."""
        cost, floor = self.model.cost, self.config.min_prefill_chunk
        return floor if cost is None else min_chunk(floor, planned_s, cost.overhead_s, cost.per_token_s)

    def _planned_s(self) -> float | None:
        target = self.config.target_step_s
        return None if target is None else target / (1.0 + self.margin)

    def budget(
        self,
        num_decodes: int,
        has_prefill_work: bool,
        target_s: float | None = None,
        decode_context: int = 0,
        ttft_tokens: int = 0,
    ) -> int:
        """Tokens the next step may feed: `num_decodes` running decodes, and prefill if any waits.

        `target_s`: this step's own time target (the tightest ITL running, engine/scheduling/step_plan.py),
        else the configured one. Without a configured target a step target applies only once the
        cost is fitted (before that the fixed maximum, as without targets). `ttft_tokens`: prompt
        tokens the waiting prompts' TTFT deadlines need this step (`weir.engine.scheduling.step_plan.ttft_tokens`);
        the prefill floor does not shrink below them, up to `min_prefill_chunk`."""
        cfg = self.config
        target = target_s if target_s is not None else cfg.target_step_s
        if target is not None and cfg.target_step_s is None and self.model.cost is None:
            target = None
        self.last_target_s = target
        if target is None:
            chosen = cfg.max_tokens
        else:
            planned = target / (1.0 + self.margin)
            chunk = max(self.prefill_floor(planned), self._deadline_chunk(ttft_tokens))
            floor = num_decodes + (chunk if has_prefill_work else 0)
            chosen = min(cfg.max_tokens, max(floor, self._fitted(planned, num_decodes, decode_context)))
        self.last_budget = chosen
        return chosen

    def _deadline_chunk(self, ttft_tokens: int) -> int:
        """The prefill the TTFT deadlines lift the floor to: `ttft_tokens`, up to the minimum chunk."""
        return min(self.config.min_prefill_chunk, ttft_tokens)

    def lifted_step_s(self, num_decodes: int, ttft_tokens: int, decode_context: int = 0) -> float | None:
        """The fitted time of a step of `num_decodes` decode rows (over `decode_context` tokens) whose
        prefill floor the TTFT deadlines lift (`budget`'s `ttft_tokens`); None before the cost is
        fitted. On a loaded CPU that step is longer than its target, so fewer steps are left."""
        cost = self.model.cost
        if cost is None:
            return None
        return cost.seconds(num_decodes + self._deadline_chunk(ttft_tokens), num_decodes, decode_context)

    def fitted_seconds(self, num_tokens: int, num_decodes: int = 0, decode_context: int = 0) -> float:
        """The fitted time of a step (`StepCost.seconds`); 0 before the cost is fitted."""
        cost = self.model.cost
        return 0.0 if cost is None else cost.seconds(num_tokens, num_decodes, decode_context)

    def prefill_tokens_within(self, step_s: float, num_decodes: int, decode_context: int = 0) -> int:
        """Prompt tokens a step of `step_s` feeds beside `num_decodes` decode rows: what the fitted
        cost leaves under the margin, at least the minimum chunk (a TTFT deadline lifts the floor to
        it); 0 before the cost is fitted. The goodput trade weighs steps by it (engine/scheduling/slo_trade.py)."""
        cost = self.model.cost
        if cost is None:
            return 0
        spare = step_s / (1.0 + self.margin) - cost.seconds(num_decodes, num_decodes, decode_context)
        fitted = min(max(spare, 0.0) / cost.per_token_s, float(self.config.max_tokens))
        return max(self.config.min_prefill_chunk, int(fitted))

    def decode_capacity(
        self, target_s: float | None, has_prefill_work: bool, mean_context: float = 0.0
    ) -> int | None:
        """Decode rows a step of `target_s` holds beside the minimum prefill chunk (when prefill
        work exists; at least 1); None: no bound (no target, no fitted cost, or decodes that cost
        nothing measurable)."""
        cost = self.model.cost
        row_s = cost.per_row_s(mean_context) if cost is not None else 0.0
        if target_s is None or cost is None or row_s <= 0:
            return None
        planned = target_s / (1.0 + self.margin)
        chunk = self.prefill_floor(planned) if has_prefill_work else 0
        spare = planned - cost.overhead_s - cost.per_token_s * chunk
        return max(1, int(min(spare / row_s, 1 << 30)))

    def _fitted(self, target_s: float, num_decodes: int, decode_context: int = 0) -> int:
        # Twice the largest step measured: the probe before the slope is known, and the bound after
        # (a fit is not trusted far outside its data).
        reach = max(self.config.initial_tokens, 2 * self.model.max_tokens_seen)
        cost = self.model.cost
        if cost is None:
            return reach
        spare = target_s - cost.seconds(num_decodes, num_decodes, decode_context)
        if spare <= 0:
            return 0
        return int(min(num_decodes + spare / cost.per_token_s, float(self.config.max_tokens), float(reach)))

    def max_running(self) -> int | None:
        """How many sequences may run at once so that a step of all their decodes plus the minimum
        prefill chunk fits the target (at least 1); None without a target or a fitted cost.

        With hysteresis: the cap moves only when the fitted value leaves a band of max(1, cap/8)
        around it, so fit noise (a step mix changed by preemptions) does not swing it and with
        it the admissions (issue 24: the cap swinging between 10 and 16 under displacement)."""
        raw = self._raw_max_running()
        held = self._held_cap
        if raw is None or held is None or abs(raw - held) > max(1, held // 8):
            self._held_cap = held = raw
        return held

    def _raw_max_running(self) -> int | None:
        cost, planned = self.model.cost, self._planned_s()
        if planned is None or cost is None:
            return None
        spare = planned - cost.overhead_s - cost.per_token_s * self.prefill_floor(planned)
        if spare <= 0:
            return 1
        row_s = cost.per_row_s(self.mean_decode_context)  # a row at the recent mean context
        if row_s <= 0:
            return None  # decodes cost nothing measurable: only --max-num-seqs caps
        return max(1, int(min(spare / row_s, 1 << 30)))

    def admits(self, num_running: int) -> bool:
        """May one more sequence start running beside `num_running`? Always when none runs."""
        cap = self.max_running()
        return num_running == 0 or cap is None or num_running < cap

    def observe(self, num_tokens: int, seconds: float, num_decodes: int = 0, decode_context: int = 0) -> None:
        """Feed back one executed step: the tokens it computed (`num_decodes` of them decode rows,
        over `decode_context` context tokens in all) and how long it took."""
        if num_tokens <= 0 or not (seconds > 0 and math.isfinite(seconds)):
            return  # as the cost model ignores it
        num_decodes = min(max(num_decodes, 0), num_tokens)
        cost = self.model.cost
        predicted = cost.seconds(num_tokens, num_decodes, decode_context) if cost is not None else 0.0
        if predicted > 0:
            # overruns only (a step faster than predicted risks nothing); one stall counts as 100% at most
            miss = min(max(seconds / predicted - 1.0, 0.0), 1.0)
            self._miss_sq = _MISS_FORGETTING * self._miss_sq + miss * miss
            self._miss_w = _MISS_FORGETTING * self._miss_w + 1.0
        if num_decodes:
            mean = decode_context / num_decodes
            self.mean_decode_context += (1.0 - self.config.forgetting) * (mean - self.mean_decode_context)
        self.model.observe(num_tokens, seconds, num_decodes, decode_context)

    def stats(self) -> StepBudgetStats:
        return StepBudgetStats(
            self.last_budget,
            self.config.target_step_s,
            self.model.cost,
            self.max_running(),
            self.margin,
            self.last_target_s,
            self.model.num_resets,
            self.model.num_refits,
            self.num_stretched_steps,
        )


def make_step_budget(config: SchedulerConfig) -> StepBudget:
    """The step budget of `config`: fixed at `max_num_batched_tokens` unless a target step time is set."""
    return StepBudget(
        StepBudgetConfig(max_tokens=config.max_num_batched_tokens, target_step_s=config.target_step_s)
    )
