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

- `a` (overhead per step: the weight read, Python, sampling), `c` (one decode row: its token,
  its logits and output), `k` (one context token a decode row attends over: attention grows
  with the context, issue 24) and `b` (one prefill token) come
  from a weighted least-squares fit of the observed steps; each new step multiplies the old
  weights by `forgetting`, so the fit follows a machine whose load changes. The slopes are
  shrunk towards their previous values (ridge terms of `min_prefill_chunk**2` token^2 and 4
  rows^2): while the recent steps all had the same shape the data say nothing about a slope,
  and the old value stands; only `a` follows the mean. A decode row costs more than a prefill
  token on a CPU (measured: ~5 ms vs ~1.7 ms for SmolLM2 with ~200-token contexts), which one
  slope for both would miss.
- The admission cap: decodes alone can overrun the target (64 running chats on two cores take
  ~0.5 s a step), and no token budget can shorten a step below its decodes. So a sequence is
  admitted only while a step of every running decode plus the minimum prefill chunk fits the
  target; past that, requests wait in the queue (TTFT) instead of slowing every running stream
  (ITL). One sequence always runs, whatever the target.
- The margin: the fit predicts a step's mean time, but the target is a bound every step should
  keep. The budget and the cap plan for `target / (1 + margin)`, the margin being twice the
  recent RMS overrun (actual / predicted - 1 when positive), at most 25%: a machine whose steps
  vary more gets smaller steps. A steady machine (±3% jitter) plans ~3% under the target.
- A fit that over-predicts is dropped: when `_RESET_AFTER` steps in a row that feed prompt tokens
  (at least `_MIN_PREFILL_TO_JUDGE`) took under half their fitted time, the model forgets
  everything it measured and fits again (the budget probes meanwhile, as below, from twice the
  largest of those steps). The slopes are pulled towards their previous values, so one stalled
  step that made the first fit (a 64-token step held 1.9 s while the benchmark client's start-up
  took both cores: 27 ms a token, against 2.5 ms measured after it) otherwise kept every later
  step at ~30 tokens, all of one size that could not move the slope: a burst of eight 128-token
  prompts waited 2.7 s for their prefill instead of ~1 s.
- A fit that drifted is refitted: when `DRIFT_STEPS` steps in a row all ran more than 15%
  slower (or all faster) than fitted, a neighbour came or went; the model refits from those
  steps alone, its slopes pulled towards the old ones times their mean ratio, so a fit made on a
  contended machine does not pin the plan once the contention ends (engine/scheduling/step_cost_drift.py,
  issue 58). Logged once per refit and counted on `/metrics`.
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

import logging
import math
from dataclasses import dataclass

from weir.engine.config import SchedulerConfig
from weir.engine.scheduling.step_cost_drift import Drift, DriftDetector, ObservedStep

logger = logging.getLogger(__name__)

# A slope below this (s/token) is treated as "tokens are free": the budget goes to the maximum.
_MIN_SLOPE_S = 1e-9
_MAX_MARGIN = 0.25  # the budget plans for at least target / 1.25
_MISS_FORGETTING = 0.95  # weight kept by each past step's miss per new step
_OVERPREDICTED = 0.5  # a step that took under this fraction of its fitted time...
_RESET_AFTER = 3  # ...this many times in a row: the fit is wrong, not the steps
_MIN_PREFILL_TO_JUDGE = 8  # prompt tokens a step feeds for its time to count towards that


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
    """The fitted cost of a step: `overhead_s + per_decode_s * decodes + per_token_s * prefill
    tokens + per_context_token_s * context tokens of the decode rows` (attention grows with it)."""

    overhead_s: float
    per_token_s: float  # one prefill (or draft) token
    per_decode_s: float  # one decode row at no context: its token, its logits and output
    per_context_token_s: float = 0.0  # one context token a decode row attends over

    def seconds(self, num_tokens: int, num_decodes: int = 0, decode_context: int = 0) -> float:
        """A step of `num_tokens` tokens, `num_decodes` of them decode rows over `decode_context`
        context tokens in all."""
        return (
            self.overhead_s
            + self.per_decode_s * num_decodes
            + self.per_token_s * (num_tokens - num_decodes)
            + self.per_context_token_s * decode_context
        )

    def per_row_s(self, mean_context: float) -> float:
        """One decode row over `mean_context` context tokens."""
        return self.per_decode_s + self.per_context_token_s * mean_context


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when `m` is singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


_KCTX = 1000.0  # the context feature is fitted in thousands of tokens (a better-scaled system)
_N = 4  # features: 1, decode rows, prefill tokens, decode context (thousands of tokens)


class StepCostModel:
    """Online weighted least squares of step seconds on (1, decode rows, prefill tokens, context
    tokens of the decode rows), with exponential forgetting and a ridge towards the previous fit.

    The context term is what attention adds: a decode row over a long context costs more than
    one over a short one, so a step's cost follows the running mix's context lengths, not only
    its row count. Its slope starts at 0 and is pulled towards its last value like the others
    (`context_ridge`, in thousands of tokens squared); steps that all have the same mean context
    cannot tell it from the per-row cost, and it stands.

    Until the cost per token is identified (two steps of sizes at least `sqrt(ridge)` tokens
    apart, in weighted spread) `cost` is None. From then on each step re-solves the 3x3 normal
    equations with `ridge` (token^2) on the prefill slope and `decode_ridge` (rows^2) on the
    decode slope, both pulled towards their last values: a slope the recent steps say nothing
    about (every step the same size) stands, and only the overhead follows the mean. The decode
    slope starts at the first fitted cost per token. `observe` is O(1).
    """

    def __init__(
        self, forgetting: float, ridge: float, decode_ridge: float = 4.0, context_ridge: float = 4.0
    ) -> None:
        self._forgetting = forgetting
        self._ridges = (0.0, decode_ridge, ridge, context_ridge)
        self._ridge = ridge
        # weighted sums of x x^T and x y, x = (1, decodes, prefill, decode context / 1000)
        self._xtx = [[0.0] * _N for _ in range(_N)]
        self._xty = [0.0] * _N
        self._theta: list[float] | None = None  # (overhead, per decode, per prefill token, per 1k context)
        # The current fit with its slopes clamped to >= 0, None while the cost per token is unknown;
        # set once per observed step (the scheduler reads it several times a step).
        self.cost: StepCost | None = None
        self.num_observed = 0
        self.max_tokens_seen = 0
        self.num_resets = 0  # fits dropped for over-predicting
        self._num_overpredicted = 0  # steps in a row that took under half their fitted time
        self._overpredicted_max_tokens = 0  # the largest of them
        self.num_refits = 0  # fits refitted after a drift (engine/scheduling/step_cost_drift.py)
        self._drift = DriftDetector()

    def observe(self, num_tokens: int, seconds: float, num_decodes: int = 0, decode_context: int = 0) -> None:
        """Add one executed step. Steps without tokens or without a positive duration are ignored."""
        if num_tokens <= 0 or not (seconds > 0 and math.isfinite(seconds)):
            return
        num_decodes = min(max(num_decodes, 0), num_tokens)
        x = (1.0, float(num_decodes), float(num_tokens - num_decodes), max(0, decode_context) / _KCTX)
        predicted = self.cost.seconds(num_tokens, num_decodes, max(0, decode_context)) if self.cost else 0.0
        if self.cost is not None and num_tokens - num_decodes >= _MIN_PREFILL_TO_JUDGE:
            # judged on steps that feed prompt tokens: the slope a stalled step poisons is theirs;
            # decode-only steps change their thread count with their rows, which no line fits
            if seconds < _OVERPREDICTED * predicted:
                self._num_overpredicted += 1
                self._overpredicted_max_tokens = max(self._overpredicted_max_tokens, num_tokens)
                if self._num_overpredicted >= _RESET_AFTER:
                    self._forget()
            else:
                self._num_overpredicted = self._overpredicted_max_tokens = 0
        drift = self._drift.observe(ObservedStep(x, seconds), predicted) if self.cost is not None else None
        if drift is not None and self._theta is not None:
            self.num_observed += 1
            self.max_tokens_seen = max(self.max_tokens_seen, num_tokens)
            self._refit_after(drift)
            return
        self._add(x, seconds, self._forgetting)
        self.num_observed += 1
        self.max_tokens_seen = max(self.max_tokens_seen, num_tokens)
        if self._theta is None:
            self._theta = self._first_fit()
        else:
            self._theta = self._refit(self._theta)
        self.cost = self._clamped_cost()

    def _refit_after(self, drift: Drift) -> None:
        """The fit drifted (engine/scheduling/step_cost_drift.py): fit again from the drifted steps alone, the
        slopes pulled towards the old ones times the drift's factor (a neighbour slows every part
        of a step alike), so a slope the recent steps cannot identify follows the machine too."""
        assert self._theta is not None
        prior = [t * drift.factor for t in self._theta]
        self._xtx = [[0.0] * _N for _ in range(_N)]
        self._xty = [0.0] * _N
        f = self._forgetting
        for step in drift.steps:
            self._add(step.features, step.seconds, f)
        self._theta = self._refit(prior)
        self.cost = self._clamped_cost()
        self.num_refits += 1
        cost = self.cost
        assert cost is not None
        logger.info(
            "the step cost drifted: %d steps in a row took %.2fx their fitted time; refitted: overhead "
            "%.1f ms, per decode row %.2f ms, per prefill token %.3f ms, per 1k context tokens %.2f ms",
            len(drift.steps),
            drift.factor,
            cost.overhead_s * 1e3,
            cost.per_decode_s * 1e3,
            cost.per_token_s * 1e3,
            cost.per_context_token_s * 1e6,
        )

    def _add(self, x: tuple[float, ...], seconds: float, f: float) -> None:
        """Add one step to the weighted sums, the old ones weighted down by `f`."""
        for i in range(_N):
            self._xty[i] = f * self._xty[i] + x[i] * seconds
            for j in range(_N):
                self._xtx[i][j] = f * self._xtx[i][j] + x[i] * x[j]

    def _forget(self) -> None:
        """Drop the fit and what it was fitted on. The probe that follows starts from the steps
        that showed the fit wrong (twice the largest of them), not from the largest step ever
        measured: running streams wait for each probed step, and a long-gone 1,000-token step
        would let the first probe take a second."""
        logger.info(
            "the step cost fit predicted %d steps in a row at over twice their time; fitting again",
            self._num_overpredicted,
        )
        self._xtx = [[0.0] * _N for _ in range(_N)]
        self._xty = [0.0] * _N
        self._theta = None
        self.cost = None
        self.max_tokens_seen = self._overpredicted_max_tokens
        self._num_overpredicted = self._overpredicted_max_tokens = 0
        self._drift.clear()
        self.num_resets += 1

    def _first_fit(self) -> list[float] | None:
        """One slope for every token (the sizes of the steps so far), once their spread is enough."""
        xtx, xty = self._xtx, self._xty
        w = xtx[0][0]
        sx = xtx[0][1] + xtx[0][2]
        sxx = xtx[1][1] + 2 * xtx[1][2] + xtx[2][2]
        sy, sxy = xty[0], xty[1] + xty[2]
        spread = max(0.0, sxx - sx * sx / w)
        if spread < self._ridge:
            return None
        slope = (sxy - sx * sy / w) / spread
        return [(sy - slope * sx) / w, slope, slope, 0.0]

    def _refit(self, prior: list[float]) -> list[float]:
        ridge = self._ridges
        m = [[self._xtx[i][j] + (ridge[i] if i == j else 0.0) for j in range(_N)] for i in range(_N)]
        v = [self._xty[i] + ridge[i] * prior[i] for i in range(_N)]
        theta = _solve(m, v)
        return prior if theta is None or not all(math.isfinite(t) for t in theta) else theta

    def _clamped_cost(self) -> StepCost | None:
        if self._theta is None:
            return None
        _, per_decode, per_token, per_kctx = self._theta
        per_token = max(per_token, _MIN_SLOPE_S)
        per_decode = max(per_decode, 0.0)
        per_kctx = max(per_kctx, 0.0)
        # the overhead that fits the weighted means with the clamped slopes
        xtx, w = self._xtx, self._xtx[0][0]
        overhead = (self._xty[0] - per_decode * xtx[0][1] - per_token * xtx[0][2] - per_kctx * xtx[0][3]) / w
        return StepCost(
            overhead_s=max(0.0, overhead),
            per_token_s=per_token,
            per_decode_s=per_decode,
            per_context_token_s=per_kctx / _KCTX,
        )


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
    if per_token_s <= _MIN_SLOPE_S or planned_s <= overhead_s:
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
