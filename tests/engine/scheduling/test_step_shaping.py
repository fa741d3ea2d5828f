"""The step shaping functions before the step cost is fitted: they leave the plan as it is."""

from __future__ import annotations

from weir.engine.config import QueuePolicy
from weir.engine.request import Request, SamplingParams
from weir.engine.scheduling.request_queue import make_waiting_queue
from weir.engine.scheduling.slo_standing import SloStanding
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig
from weir.engine.scheduling.step_shaping import first_answer_sit_outs, fit_decodes, goodput_target, ttft_need


def _clock_not_read() -> float:
    raise AssertionError("the clock is read only once there is something to weigh")


def _budget() -> StepBudget:
    return StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.1))


def _decode(rid: str, tenant: str = "t") -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(), tenant_id=tenant)
    req.output_token_ids.append(4)
    req.num_computed_tokens = 3
    return req


def test_without_a_fitted_cost_the_target_and_the_rows_stand() -> None:
    budget = _budget()
    assert budget.model.cost is None
    decodes = [_decode("a"), _decode("b", "u")]
    prompt = Request("p", list(range(40)), SamplingParams())
    queue = make_waiting_queue(QueuePolicy.FCFS)
    requests = {r.request_id: r for r in (*decodes, prompt)}
    assert (
        goodput_target(budget, queue, SloStanding(), requests, _clock_not_read, 0.1, 0.2, decodes, [prompt])
        == 0.1
    )
    assert fit_decodes(budget, decodes, 0.1, True) == decodes
    scheduled = {"a": 1, "b": 1, "p": 40}
    assert first_answer_sit_outs(budget, requests, _clock_not_read, scheduled, {}, set()) == set()


def test_no_target_needs_no_prompt_tokens() -> None:
    prompt = Request("p", list(range(40)), SamplingParams())
    assert ttft_need(_budget(), _clock_not_read, [prompt], 0, 0, None) == 0
