"""Predicting a request's time to first token at admission, from the engine's load snapshot.

The model is deliberately simple and cheap (it runs for every request):

    TTFT ~ one step in flight + (prompt tokens queued ahead + own prompt) / prefill rate

- "Ahead" counts the waiting prompt tokens of the same or a higher priority class: the scheduler
  serves classes in order, so lower classes never delay this request (they are preempted when
  blocks are short).
- The prefill rate is the engine's measured moving average (`EngineStats.prefill_tokens_per_s`).
  It is measured over whole steps, so the decodes batched with the prefill (the decode load) are
  already priced in.
- The step in flight is one decode step (`1 / decode_steps_per_s`) when sequences are running.
- Before the engine has measured a prefill rate there is no prediction, and nothing is rejected.
- Planned steps (issue 24): once the engine has fitted its step cost, the prediction follows the
  steps the scheduler will plan for this request, not the measured average, which reflects
  whatever ran before (800 ms batch steps on a CPU), nor the measured decode step rate (a loaded
  CPU's slow steps predicted 10 s for a 65-token chat with nothing queued ahead).
  The step in flight counts half its own target (its expected remainder). The next step is
  planned for the sequences running now (the last step's target); once the request runs (after
  its first chunk) its steps last its ITL target (the tenant's `tpot_slo_ms`, else its class
  default; at most the throughput step). Lower classes' decodes and chunks yield to it but for
  one decode row, so each step holds `(step - overhead - rows * cost per row) / cost per prefill
  token` of its prompt and the queue ahead, rows being the running sequences of its class and
  better (plus that one), and at least the minimum chunk (`weir.engine.scheduling.step_budget.min_chunk`: fewer
  tokens where 32 take more than a quarter of the step). A tenant whose own requests ran slowly
  (long steps shared with batch work) is not refused for that: its next request's steps are
  planned shorter.
- The first step at the running set's target matters: an interactive chat arriving while only
  batch work runs gets its whole prompt in one 800 ms CPU step, where four 300 ms steps were
  predicted (measured on SmolLM2: 2.25 s predicted with nothing queued ahead, 0.35-0.8 s got).

The engine's snapshot is refreshed once per step, so requests admitted since the last snapshot
are invisible to it; `RecentAdmissions` adds them back until two newer snapshots have been seen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority
from weir.engine.scheduling.step_budget import min_chunk

_NUM_CLASSES = len(Priority)
_MIN_CHUNK = 32  # the step budget's minimum prefill chunk (StepBudgetConfig.min_prefill_chunk)


@dataclass(frozen=True)
class TTFTPrediction:
    """A predicted time to first token and what it was based on."""

    seconds: float
    tokens_ahead: int  # waiting prompt tokens of the same or higher classes, this request excluded
    prefill_tokens_per_s: float


def tokens_ahead(waiting_by_priority: tuple[int, ...], priority: Priority) -> int:
    """Waiting prompt tokens the scheduler serves before (or with) a request of `priority`."""
    return sum(waiting_by_priority[: int(priority) + 1])


def planned_step_s(stats: EngineStats, priority: Priority, itl_s: float | None = None) -> float | None:
    """The step the scheduler plans while a request of `priority` (ITL override `itl_s`) runs:
    its ITL target, at most the throughput target; None while the step cost is not fitted."""
    budget = stats.step_budget
    if budget is None or budget.cost is None:
        return None
    own = itl_s if itl_s is not None else stats.class_targets.of(priority).itl_s
    targets = [t for t in (own, budget.target_step_s) if t is not None]
    return min(targets) if targets else None


def rows_kept(stats: EngineStats, priority: Priority) -> int:
    """The running decode rows that do not yield to a request of `priority`: its own class and
    better, plus one row of the looser classes (they give way but for one)."""
    rows = sum(stats.running_by_priority[: int(priority) + 1])
    return rows + (1 if stats.num_running > rows else 0)


def _tokens_per_step(stats: EngineStats, priority: Priority, step_s: float) -> int:
    """Prompt tokens a step planned at `step_s` holds beside the decode rows kept (`rows_kept`)."""
    budget = stats.step_budget
    assert budget is not None and budget.cost is not None
    cost = budget.cost
    planned = step_s / (1.0 + budget.margin)
    floor = min_chunk(_MIN_CHUNK, planned, cost.overhead_s, cost.per_token_s)
    spare = planned - cost.overhead_s - cost.per_decode_s * rows_kept(stats, priority)
    return max(floor, int(max(spare, 0.0) / cost.per_token_s))


def _lifted_step_s(stats: EngineStats, priority: Priority) -> float:
    """The fitted time of a step holding the minimum chunk beside the decode rows kept."""
    budget = stats.step_budget
    assert budget is not None and budget.cost is not None
    rows = rows_kept(stats, priority)
    return budget.cost.seconds(rows + _MIN_CHUNK, rows)


def predict_ttft(
    stats: EngineStats,
    priority: Priority,
    num_prompt_tokens: int,
    unseen_ahead: int = 0,
    itl_s: float | None = None,
) -> TTFTPrediction | None:
    """The predicted TTFT of a new request, or None while the engine has no measured prefill rate."""
    rate = stats.prefill_tokens_per_s
    if rate <= 0:
        return None
    ahead = tokens_ahead(stats.waiting_tokens_by_priority, priority) + unseen_ahead
    step_s = planned_step_s(stats, priority, itl_s)
    budget = stats.step_budget
    if step_s is not None and budget is not None and budget.cost is not None:
        # The steps run now are planned for the running set (the last step's target: 800 ms on a
        # CPU while only batch work runs); the request constrains them only once it runs itself,
        # i.e. after its first chunk: the first step at the current target, the rest at its own.
        current = budget.step_target_s if budget.step_target_s is not None else step_s
        in_flight = current / 2 if stats.num_running else 0.0  # the step running now, half done
        total = ahead + num_prompt_tokens
        first = _tokens_per_step(stats, priority, current)
        rest_s = min(step_s, current)
        per_step = _tokens_per_step(stats, priority, rest_s)
        if per_step < _MIN_CHUNK:
            # The request has a TTFT objective (else nothing is predicted): while its deadline
            # needs it, the scheduler lifts the prefill floor up to the minimum chunk
            # (weir.engine.scheduling.step_plan.ttft_tokens), and such a step lasts what its cost says.
            per_step = _MIN_CHUNK
            rest_s = max(rest_s, _lifted_step_s(stats, priority))
        rest = math.ceil(max(0, total - first) / per_step)
        seconds = in_flight + current + rest * rest_s
        return TTFTPrediction(seconds, ahead, total / max(seconds - in_flight, 1e-9))
    in_flight = 1.0 / stats.decode_steps_per_s if stats.num_running and stats.decode_steps_per_s > 0 else 0.0
    return TTFTPrediction(in_flight + (ahead + num_prompt_tokens) / rate, ahead, rate)


class RecentAdmissions:
    """Prompt tokens admitted since the engine's last snapshots, per priority class.

    A request admitted now shows up in the snapshot taken after the next step at the latest, so
    counts are kept for the current and the previous snapshot (two generations).
    """

    def __init__(self) -> None:
        self._seen: object | None = None
        self._generations: deque[list[int]] = deque([[0] * _NUM_CLASSES], maxlen=2)
        self._seqs: deque[list[int]] = deque([[0] * _NUM_CLASSES], maxlen=2)  # sequences, likewise

    def observe(self, stats: EngineStats) -> None:
        """Start a new generation when the engine published a new snapshot."""
        if stats is not self._seen:
            self._seen = stats
            self._generations.appendleft([0] * _NUM_CLASSES)
            self._seqs.appendleft([0] * _NUM_CLASSES)

    def add(self, priority: Priority, num_tokens: int, num_seqs: int = 1) -> None:
        self._generations[0][int(priority)] += num_tokens
        self._seqs[0][int(priority)] += num_seqs

    def seqs_ahead(self, priority: Priority) -> int:
        """Unseen sequences of `priority` and better (they will run beside or before it)."""
        return sum(sum(g[: int(priority) + 1]) for g in self._seqs)

    def ahead(self, priority: Priority) -> int:
        """Unseen tokens the scheduler would serve before (or with) `priority`."""
        return sum(sum(g[: int(priority) + 1]) for g in self._generations)

    def total(self) -> int:
        return sum(sum(g) for g in self._generations)
