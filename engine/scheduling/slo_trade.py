"""The goodput trade of a step: a step longer than the tightest ITL target against first tokens
that would otherwise miss their TTFT target (issue 58).

Goodput counts the requests that meet both their targets: the first token within the TTFT
target, every gap within the ITL target (engine/scheduling/slo_standing.py). Holding every step at the
tightest ITL target keeps the running streams' gaps, but on a slow or loaded machine a step of
that length holds only a few prompt tokens beside the decode rows, and the prompts waiting
behind them miss their first token by far (measured: every first token 15-24 s late against a
2 s target, while the streams that ran got a token every 50 ms against a 100 ms target). So each
step with prompts to feed weighs the two explicitly:

- **gain** of a step of `s`: the timed prompts that steps of `target` would finish after their
  TTFT deadline and steps of `s` would finish in time (`ttft_misses`: served in `prefill_key`
  order, a prompt finishes after the ones before it), counting only the prompts whose streams
  then fit a step of `target` beside the rows before them (`StepBudget.decode_capacity`): on an
  overloaded machine a first token saved starts a stream that misses its ITL anyway, and
  stretching for it only shuffles who misses;
- **price**: the decode rows of the step that still stand (no target missed yet) and whose gap,
  the time since their last token plus `s`, would be over their ITL target.

The step target becomes the stretch of `STRETCHES` (at most `MAX_STRETCH` times the target, and
never past the throughput target) with the largest gain minus price, when that is positive; the
target stands otherwise (ties keep the shorter step). A stream that already missed a target costs
nothing, and a prompt already past its deadline gains nothing; but where a timed prompt is late
and the stretch breaks no gap that the target would have kept (every row overruns the target
anyway: the decode rows alone are longer than it), the shortest stretch is taken: a prompt
whose first token is late anyway was otherwise fed the shrunk prefill floor, one token a step
on a loaded CPU (engine/scheduling/step_plan.py `ttft_tokens` lifts the floor only for prompts still in
time), and trickled in for seconds while the streams it waited for had missed their targets.
A stretched step feeds at least the minimum prefill chunk (`Scheduler.schedule`); one that a
standing stream pays for is never planned past `MAX_STRETCH` times the target at the fitted cost.

Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from weir.engine.request import Request
from weir.engine.scheduling.step_plan import prefill_key

STRETCHES = (1.25, 1.5, 2.0)  # the longer steps weighed, as multiples of the step's ITL target
MAX_STRETCH = STRETCHES[-1]


def ttft_misses(prompts: Iterable[Request], now: float, step_s: float, tokens_per_step: int) -> int:
    """Timed prompts that steps of `step_s`, each feeding `tokens_per_step` prompt tokens, finish
    after their TTFT deadline (in `prefill_key` order; prompts past it already are not counted)."""
    if step_s <= 0:
        return 0
    misses = 0
    ahead = 0
    for req in sorted(prompts, key=prefill_key):
        ttft = req.latency.ttft_s
        if ttft is None or req.num_remaining <= 1 or now >= req.arrival_s + ttft:
            continue
        ahead += req.num_remaining
        steps = int((req.arrival_s + ttft - now) / step_s)
        if ahead > steps * max(0, tokens_per_step):
            misses += 1
    return misses


def breaks_itl(row: Request, now: float, step_s: float) -> bool:
    """Whether a step of `step_s` from `now` makes the gap of decode `row` longer than its ITL target."""
    itl = row.latency.itl_s
    if itl is None or not row.times.token_s:
        return False
    return now - row.times.token_s[-1] + step_s > itl


@dataclass(frozen=True)
class StepShape:
    """What the trade needs of the fitted step cost, for the decode rows of this step."""

    tokens_within: Callable[[float], int]  # prompt tokens a step planned at `s` feeds beside the rows
    seconds_with: Callable[[int], float]  # the fitted time of a step feeding `n` prompt tokens beside them
    max_rows: int | None = None  # decode rows a step of the target holds (None: no bound)


def traded_target(
    target_s: float,
    throughput_s: float | None,
    decodes: Sequence[Request],
    prompts: Sequence[Request],
    now: float,
    shape: StepShape,
    stands: Callable[[Request], bool],
) -> float:
    """The step's time target after the goodput trade (module docstring): `target_s` (the tightest
    ITL running), or a stretch of it that saves more first tokens than it breaks standing streams,
    or, for prompts already late, the shortest stretch that makes no gap longer than its ITL that
    the target would have kept (a stream that missed a target once still keeps the rest). Each stretch `s` is
    weighed at the time its step takes (`shape.seconds_with` its prompt tokens, at least `s`); one
    that a standing stream pays for is not taken past `MAX_STRETCH` times the target. A first
    token saved counts only for a prompt whose stream then fits beside the rows before it
    (`shape.max_rows`): a stream that cannot keep its ITL misses its SLO anyway."""
    timed = sorted(
        (p for p in prompts if p.latency.ttft_s is not None and p.num_remaining > 1), key=prefill_key
    )
    late = any(now >= p.arrival_s + p.latency.ttft_s for p in timed if p.latency.ttft_s is not None)
    if shape.max_rows is not None:
        timed = timed[: max(0, shape.max_rows - len(decodes))]
    base_tokens = shape.tokens_within(target_s)
    base_s = max(target_s, shape.seconds_with(base_tokens))
    missed = ttft_misses(timed, now, base_s, base_tokens)
    if missed == 0 and not late:
        return target_s
    # the gaps no plan keeps: the step is at least the target, and at least its decode rows alone
    kept_s = max(target_s, shape.seconds_with(0))
    broken = {id(row) for row in decodes if breaks_itl(row, now, kept_s)}
    best_s, best = target_s, 0
    free_s = None  # the shortest stretch that breaks no gap the target would keep
    for factor in STRETCHES:
        planned_s = target_s * factor
        if throughput_s is not None and planned_s > throughput_s:
            break
        tokens = shape.tokens_within(planned_s)
        step_s = max(planned_s, shape.seconds_with(tokens))
        hurt = [row for row in decodes if id(row) not in broken and breaks_itl(row, now, step_s)]
        price = sum(1 for row in hurt if stands(row))
        if price and step_s > MAX_STRETCH * target_s:
            continue
        if not hurt and free_s is None:
            free_s = planned_s
        gain = missed - ttft_misses(timed, now, step_s, tokens)
        if gain - price > best:
            best_s, best = planned_s, gain - price
    if best_s == target_s and late and free_s is not None:
        return free_s  # late prompts: a little longer, where no stream's gap gets longer for it
    return best_s
