"""gateway/admission/slo.py: the predicted TTFT follows the steps the scheduler plans once it has fitted
its step cost; before that, the measured prefill rate."""

from __future__ import annotations

import pytest

from tests.engine.latency_scenarios import SCENARIO_CLASS_TARGETS
from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority
from weir.engine.scheduling.step_budget import StepBudgetStats
from weir.engine.scheduling.step_cost_model import StepCost
from weir.gateway.admission.slo import planned_step_s, predict_ttft

# a 2-core CPU: 35 ms a step, 1.7 ms per prefill token, 5 ms per decode row; 800 ms steps
_COST = StepCost(overhead_s=0.035, per_token_s=0.0017, per_decode_s=0.005)


def _stats(**kw: object) -> EngineStats:
    base: dict[str, object] = dict(
        num_running=40,
        num_waiting=0,
        num_total_blocks=100,
        num_free_blocks=50,
        block_size=16,
        prefill_tokens_per_s=60.0,  # measured while 40 batch decodes shared each 800 ms step
        decode_steps_per_s=1.25,
        class_targets=SCENARIO_CLASS_TARGETS,
        step_budget=StepBudgetStats(100, 0.8, _COST),
    )
    base.update(kw)
    return EngineStats(**base)  # type: ignore[arg-type]


def test_the_planned_step_is_the_class_itl_at_most_the_throughput_step() -> None:
    stats = _stats()
    assert planned_step_s(stats, Priority.INTERACTIVE) == 0.3
    assert planned_step_s(stats, Priority.STANDARD) == 0.8
    assert planned_step_s(stats, Priority.BATCH) == 0.8
    assert planned_step_s(stats, Priority.INTERACTIVE, itl_s=0.2) == 0.2  # the tenant's tpot_slo_ms
    assert planned_step_s(_stats(step_budget=None), Priority.INTERACTIVE) is None


def test_an_interactive_chat_is_predicted_on_its_planned_steps_not_the_slow_average() -> None:
    stats = _stats(waiting_tokens_by_priority=(0, 0, 4000))
    got = predict_ttft(stats, Priority.INTERACTIVE, 200)
    assert got is not None
    # a 300 ms step holds (0.3 - 0.035) / 0.0017 = 155 prompt tokens: 2 steps + half the one in
    # flight (its own target unknown here: the planned 300 ms)
    assert got.seconds == pytest.approx(0.75)
    # the measured average would have said 200 / 60 + 0.8 = 4.1 s and refused a 2 s objective
    assert got.tokens_ahead == 0


def test_the_step_in_flight_counts_half_its_own_target_never_the_measured_step_rate() -> None:
    # a loaded CPU: one decode step measured every 5 s, the last step a batch step of 800 ms
    slow = _stats(decode_steps_per_s=0.2, step_budget=StepBudgetStats(100, 0.8, _COST, step_target_s=0.8))
    got = predict_ttft(slow, Priority.INTERACTIVE, 65)
    # half of 800 ms, then its whole prompt in the next step, still planned for the batch work
    assert got is not None and got.seconds == pytest.approx(0.4 + 0.8)
    idle = predict_ttft(_stats(num_running=0), Priority.INTERACTIVE, 65)
    assert idle is not None and idle.seconds == pytest.approx(0.3)  # nothing in flight
    # the queue ahead of the same or better classes is in it: 400 + 65 tokens = 3 steps of 155
    queued = _stats(waiting_tokens_by_priority=(400, 0, 4000), num_running=0)
    ahead = predict_ttft(queued, Priority.INTERACTIVE, 65)
    assert ahead is not None and ahead.seconds == pytest.approx(3 * 0.3) and ahead.tokens_ahead == 400


def test_without_a_fitted_cost_the_measured_rate_stands() -> None:
    stats = _stats(step_budget=StepBudgetStats(100, 0.8, None))
    got = predict_ttft(stats, Priority.INTERACTIVE, 120)
    assert got is not None and got.seconds == pytest.approx(0.8 + 120 / 60.0)


def test_the_first_chunk_runs_at_the_running_sets_target_the_rest_at_its_own() -> None:
    # only batch work runs (800 ms steps): an 800 ms step holds (0.8 - 0.035 - 0.005) / 0.0017 =
    # 447 tokens beside the one batch row that stays; the 1,000-token prompt's other 553 go in
    # 300 ms steps of 152 tokens (4 of them) once it runs
    batch = _stats(
        running_by_priority=(0, 0, 40), step_budget=StepBudgetStats(100, 0.8, _COST, step_target_s=0.8)
    )
    got = predict_ttft(batch, Priority.INTERACTIVE, 1000)
    assert got is not None and got.seconds == pytest.approx(0.4 + 0.8 + 4 * 0.3)


def test_running_rows_of_its_own_class_and_better_take_their_share_of_each_step() -> None:
    # 8 interactive chats decoding: 8 rows + 1 batch row take 45 ms of each 300 ms step, which
    # then holds (0.3 - 0.035 - 0.045) / 0.0017 = 129 tokens: 300 tokens need 3 steps, not 2
    busy = _stats(
        running_by_priority=(8, 0, 32), step_budget=StepBudgetStats(100, 0.8, _COST, step_target_s=0.3)
    )
    got = predict_ttft(busy, Priority.INTERACTIVE, 300)
    assert got is not None and got.seconds == pytest.approx(0.15 + 3 * 0.3)
    alone = _stats(num_running=8, running_by_priority=(8, 0, 0), step_budget=busy.step_budget)
    fewer = predict_ttft(alone, Priority.INTERACTIVE, 300)  # no looser row to keep: 132 tokens a step
    assert fewer is not None and fewer.seconds == pytest.approx(0.15 + 3 * 0.3)


def test_on_a_loaded_cpu_the_deadline_lifted_chunk_and_its_longer_step_are_predicted() -> None:
    # The served machine of the noisy trace: 240 ms a step, 5 ms a prompt token, 8 ms a row. A
    # 300 ms step beside 4 quiet rows leaves nothing for prefill, but the scheduler lifts the floor
    # to the 32-token minimum chunk while the TTFT deadline needs it (weir.engine.scheduling.step_plan), and such
    # a step takes 0.24 + 4 * 0.008 + 32 * 0.005 = 0.432 s: 140 tokens (70 ahead + 70) are the
    # first step's 5, then 5 lifted steps, not a trickle of 5 tokens a step (27 steps, 8.3 s).
    loaded = StepCost(overhead_s=0.24, per_token_s=0.005, per_decode_s=0.008)
    stats = _stats(
        num_running=4,
        running_by_priority=(4, 0, 0),
        waiting_tokens_by_priority=(70, 0, 0),
        step_budget=StepBudgetStats(100, 0.8, loaded, step_target_s=0.3),
    )
    got = predict_ttft(stats, Priority.INTERACTIVE, 70)
    lifted = 0.24 + 4 * 0.008 + 32 * 0.005
    assert got is not None and got.seconds == pytest.approx(0.15 + 0.3 + 5 * lifted)
