"""How the latency targets shape a step the scheduler plans: the goodput trade's step target, the
prompt tokens the TTFT deadlines need, the decodes a step of the target holds, and the decode
rows that sit a step out for another tenant's first answer.

The order of the rows and the step target itself are engine/scheduling/step_plan.py's; these
functions weigh them against the fitted step cost (`StepBudget`). The scheduler gathers what they
read into one `StepState` when it plans a step, calls them, and keeps the counts. Plain Python,
no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice

from weir.engine.request import Request
from weir.engine.scheduling.request_queue import WaitingQueue
from weir.engine.scheduling.slo_standing import SloStanding
from weir.engine.scheduling.slo_trade import StepShape, traded_target
from weir.engine.scheduling.step_budget import StepBudget
from weir.engine.scheduling.step_plan import (
    FIRST_ANSWER_TOKENS,
    fair_rows,
    first_answer_yields,
    owes_itl,
    ttft_tokens,
)

# Waiting requests the goodput trade of a step looks at (engine/scheduling/slo_trade.py), in queue order.
TRADE_WAITING = 64


@dataclass
class StepState:
    """What shaping one step reads: the scheduler's step budget, queue, SLO standing, requests and
    clock, and the rows the step starts from. `decodes` (by class) becomes the rows a step of
    the target holds once `fit_decodes` has chosen them; `prefills` are the running prompts in
    prefill order; `head` is the waiting head."""

    budget: StepBudget
    waiting: WaitingQueue
    standing: SloStanding
    requests: Mapping[str, Request]
    clock: Callable[[], float]
    throughput_s: float | None  # the throughput step time; None: a fixed token budget
    decodes: list[Request]
    prefills: list[Request]
    head: Request | None

    @property
    def prompts(self) -> list[Request]:
        """The running prompts, then the waiting head."""
        return self.prefills if self.head is None else [*self.prefills, self.head]

    @property
    def has_prefill_work(self) -> bool:
        return bool(self.prefills) or self.head is not None

    @property
    def context(self) -> int:
        """The decodes' computed tokens: what their attention reads."""
        return sum(r.num_computed_tokens for r in self.decodes)


def goodput_target(state: StepState, target_s: float) -> float:
    """The step's target after the goodput trade: longer than the tightest ITL `target_s` when that
    saves more first tokens than it breaks streams that still meet their SLO
    (engine/scheduling/slo_trade.py). The prompts weighed are the running ones and the first
    `TRADE_WAITING` waiting: a burst waits in the queue, not in the running set, and its
    deadlines pass there too."""
    budget, waiting, decodes = state.budget, state.waiting, state.decodes
    if budget.model.cost is None:
        return target_s  # nothing to weigh before the step cost is fitted
    # (iterating a long queue is O(n), sorted for the priority queue: past 4x the look, the head)
    if len(waiting) <= 4 * TRADE_WAITING:
        queued = list(islice(waiting, TRADE_WAITING))
    else:
        queued = [head] if (head := waiting.peek()) is not None else []
    prompts = [*state.prefills, *queued]
    context = state.context
    state.standing.retain(state.requests)
    rows = len(decodes)
    shape = StepShape(
        tokens_within=lambda step_s: budget.prefill_tokens_within(step_s, rows, context),
        seconds_with=lambda tokens: budget.fitted_seconds(rows + tokens, rows, context),
        max_rows=budget.decode_capacity(target_s, True, context / rows if rows else 0.0),
    )
    now = state.clock()
    traded = traded_target(target_s, state.throughput_s, decodes, prompts, now, shape, state.standing.stands)
    if traded > target_s:
        budget.num_stretched_steps += 1
    return traded


def ttft_need(state: StepState, target_s: float | None) -> int:
    """Prompt tokens this step must feed for the waiting TTFT deadlines (`ttft_tokens`), the
    steps left counted at the time a step feeding them takes when that is longer than the
    target (`StepBudget.lifted_step_s`): on a loaded CPU the lifted floor itself stretches the
    step (measured in the simulation: 430 ms steps under a 300 ms target), and fewer remain."""
    if target_s is None:
        return 0
    now = state.clock()
    prompts = state.prompts
    need = ttft_tokens(prompts, now, target_s)
    step_s = state.budget.lifted_step_s(len(state.decodes), need, state.context) if need else None
    return ttft_tokens(prompts, now, step_s) if step_s is not None and step_s > target_s else need


def fit_decodes(state: StepState, target_s: float) -> list[Request]:
    """The decodes a step of `target_s` holds: every one owed this ITL, then the others (looser
    classes) up to the decode capacity, at least one of them; the rest sit out a step. Where
    a class does not fit whole its rows are shared between its tenants by weight, least
    recently served first within a tenant (`fair_rows`). Owed decodes are shared so only
    when several tenants owe: one tenant alone keeps all its rows (one longer step beats
    two at the same ITL)."""
    decodes = state.decodes
    mean_context = state.context / len(decodes) if decodes else 0.0
    capacity = state.budget.decode_capacity(target_s, state.has_prefill_work, mean_context)
    if capacity is None or len(decodes) <= capacity:
        return decodes
    owed = [r for r in decodes if owes_itl(r, target_s)]
    rest = [r for r in decodes if not owes_itl(r, target_s)]
    if len(owed) > capacity and len({r.tenant_id for r in owed}) > 1:
        kept = fair_rows(owed, capacity)
    else:
        kept = owed
    # The looser classes get what is left, and one row at least: they rotate through it
    # least recently served first, so none waits for ever behind owed decodes.
    kept = kept + fair_rows(rest, max(capacity - len(kept), 1 if rest else 0))
    return sorted(kept, key=lambda r: int(r.priority))


def first_answer_sit_outs(
    state: StepState, scheduled: Mapping[str, int], spec_slots: Mapping[str, int], sat_out: set[str]
) -> set[str]:
    """The decode rows of the planned step that sit it out for another tenant's first answer
    (`first_answer_yields`; `sat_out`: those that sat the last step out). Decided once the
    answer's last chunk is in the step, so the step still moves; a row keeps the slot it was
    given and runs next step."""
    cost = state.budget.model.cost
    if cost is None:
        return set()
    firsts: list[Request] = []
    decodes: list[Request] = []
    others: list[Request] = []  # every other row: the tenants' load in the step counts them too
    for rid, n in scheduled.items():
        req = state.requests[rid]
        if req.output_token_ids and n == 1 and rid not in spec_slots:
            decodes.append(req)
        elif (
            not req.output_token_ids
            and req.num_computed_tokens + n == req.num_tokens
            and n <= FIRST_ANSWER_TOKENS
        ):
            firsts.append(req)
        else:
            others.append(req)
    if not firsts or not decodes:
        return set()
    step_s = cost.seconds(sum(scheduled.values()), len(decodes), sum(r.num_computed_tokens for r in decodes))
    return {
        row.request_id for row in first_answer_yields(firsts, decodes, sat_out, state.clock(), step_s, others)
    }
