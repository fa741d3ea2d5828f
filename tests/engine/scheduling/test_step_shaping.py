"""The step shaping functions before the step cost is fitted: they leave the plan as it is; and
the step state they read."""

from __future__ import annotations

from weir.engine.config import QueuePolicy
from weir.engine.request import Request, SamplingParams
from weir.engine.scheduling.request_queue import make_waiting_queue
from weir.engine.scheduling.slo_standing import SloStanding
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig
from weir.engine.scheduling.step_shaping import (
    StepState,
    first_answer_sit_outs,
    fit_decodes,
    goodput_target,
    ttft_need,
)


def _clock_not_read() -> float:
    raise AssertionError("the clock is read only once there is something to weigh")


def _budget() -> StepBudget:
    return StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.1))


def _decode(rid: str, tenant: str = "t") -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(), tenant_id=tenant)
    req.output_token_ids.append(4)
    req.num_computed_tokens = 3
    return req


def _state(
    budget: StepBudget, decodes: list[Request], prefills: list[Request], head: Request | None = None
) -> StepState:
    requests = {r.request_id: r for r in (*decodes, *prefills)}
    queue = make_waiting_queue(QueuePolicy.FCFS)
    return StepState(budget, queue, SloStanding(), requests, _clock_not_read, 0.2, decodes, prefills, head)


def test_without_a_fitted_cost_the_target_and_the_rows_stand() -> None:
    budget = _budget()
    assert budget.model.cost is None
    decodes = [_decode("a"), _decode("b", "u")]
    prompt = Request("p", list(range(40)), SamplingParams())
    state = _state(budget, decodes, [prompt])
    assert goodput_target(state, 0.1) == 0.1
    assert fit_decodes(state, 0.1) == decodes
    scheduled = {"a": 1, "b": 1, "p": 40}
    assert first_answer_sit_outs(state, scheduled, {}, set()) == set()


def test_no_target_needs_no_prompt_tokens() -> None:
    prompt = Request("p", list(range(40)), SamplingParams())
    assert ttft_need(_state(_budget(), [], [prompt]), None) == 0


def test_the_step_state_reads_its_prompts_and_context_from_the_rows() -> None:
    decodes = [_decode("a"), _decode("b", "u")]
    prompt = Request("p", list(range(40)), SamplingParams())
    head = Request("w", list(range(8)), SamplingParams())
    state = _state(_budget(), decodes, [prompt], head)
    assert state.prompts == [prompt, head] and state.has_prefill_work and state.context == 6
    state.decodes = decodes[:1]  # the rows a step of the target holds
    assert state.context == 3
    alone = _state(_budget(), decodes, [])
    assert alone.prompts == [] and not alone.has_prefill_work
