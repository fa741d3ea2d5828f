"""The step cost model: each step's time, fitted online from the steps the engine executed.

    step time ~ a + c * decodes + k * decode context + b * prefill tokens
                                                       (fitted online, exponential forgetting)

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
- A fit that over-predicts is dropped: when `_RESET_AFTER` steps in a row that feed prompt tokens
  (at least `_MIN_PREFILL_TO_JUDGE`) took under half their fitted time, the model forgets
  everything it measured and fits again (the step budget probes meanwhile, from twice the
  largest of those steps: engine/scheduling/step_budget.py). The slopes are pulled towards
  their previous values, so one stalled step that made the first fit (a 64-token step held
  1.9 s while the benchmark client's start-up took both cores: 27 ms a token, against 2.5 ms
  measured after it) otherwise kept every later step at ~30 tokens, all of one size that could not move the slope: a burst of eight 128-token
  prompts waited 2.7 s for their prefill instead of ~1 s.
- A fit that drifted is refitted: when `DRIFT_STEPS` steps in a row all ran more than 15%
  slower (or all faster) than fitted, a neighbour came or went; the model refits from those
  steps alone, its slopes pulled towards the old ones times their mean ratio, so a fit made on a
  contended machine does not pin the plan once the contention ends (engine/scheduling/step_cost_drift.py,
  issue 58). Logged once per refit and counted on `/metrics`.

The step budget (engine/scheduling/step_budget.py) plans each step's tokens and the running cap
from this fit. Plain Python, no torch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from weir.engine.scheduling.step_cost_drift import Drift, DriftDetector, ObservedStep

logger = logging.getLogger(__name__)

# A slope below this (s/token) is treated as "tokens are free": the budget goes to the maximum.
MIN_SLOPE_S = 1e-9
_OVERPREDICTED = 0.5  # a step that took under this fraction of its fitted time...
_RESET_AFTER = 3  # ...this many times in a row: the fit is wrong, not the steps
_MIN_PREFILL_TO_JUDGE = 8  # prompt tokens a step feeds for its time to count towards that


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
        per_token = max(per_token, MIN_SLOPE_S)
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
