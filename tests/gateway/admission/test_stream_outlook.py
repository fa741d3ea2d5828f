"""gateway/admission/stream_outlook.py: a new interactive request is refused when it cannot meet
both its targets beside the running streams (no seat under the running cap, or its row tips their
steps over the ITL target), and admitted where refusing helps no one.

A machine of `30 ms + 4 ms per decode row`; the interactive ITL target 100 ms: 17 rows fit a step
(98 ms), 18 do not (102 ms)."""

from __future__ import annotations

import pytest

from tests.gateway.admission_doubles import Setup, admit, make_setup, request, sample, stats, tenant
from weir.engine.engine_stats import EngineStats
from weir.engine.latency_targets import CPU_CLASS_TARGETS
from weir.engine.request import Priority
from weir.engine.scheduling.step_budget import StepBudgetStats
from weir.engine.scheduling.step_cost_model import StepCost
from weir.gateway.admission.stream_outlook import stream_outlook
from weir.gateway.http.errors import ServiceUnavailableError

_COST = StepCost(overhead_s=0.03, per_token_s=0.0015, per_decode_s=0.004)


def _stats(
    interactive: int, batch: int = 0, max_running: int | None = 64, cost: StepCost = _COST
) -> EngineStats:
    return stats(
        num_running=interactive + batch,
        running_by_priority=(interactive, 0, batch),
        prefill_tokens_per_s=600.0,
        decode_steps_per_s=10.0,
        class_targets=CPU_CLASS_TARGETS,
        step_budget=StepBudgetStats(64, 0.8, cost, max_running=max_running, step_target_s=0.1),
    )


def test_nothing_is_refused_before_the_step_cost_is_fitted() -> None:
    unfitted = stats(step_budget=StepBudgetStats(64, 0.8, None))
    assert stream_outlook(unfitted, Priority.INTERACTIVE) is None
    assert stream_outlook(stats(), Priority.INTERACTIVE) is None


def test_the_row_that_tips_the_step_over_the_itl_target_is_refused() -> None:
    fits = stream_outlook(_stats(16), Priority.INTERACTIVE)
    assert fits is not None and fits.gap_s == pytest.approx(0.03 + 17 * 0.004)
    assert not fits.refuses(0.1)
    tips = stream_outlook(_stats(17), Priority.INTERACTIVE)
    assert tips is not None and tips.misses_itl(0.1) and tips.refuses(0.1)
    # admitted since the snapshot count too: 16 running and one just admitted
    assert stream_outlook(_stats(16), Priority.INTERACTIVE, unseen_seqs=1).refuses(0.1)  # type: ignore[union-attr]
    # n = 2 is two rows
    assert stream_outlook(_stats(16), Priority.INTERACTIVE, num_seqs=2).refuses(0.1)  # type: ignore[union-attr]


def test_a_machine_too_slow_for_the_target_is_not_a_reason_to_refuse() -> None:
    slow = StepCost(overhead_s=0.12, per_token_s=0.005, per_decode_s=0.01)  # no step keeps 100 ms
    outlook = stream_outlook(_stats(4, cost=slow), Priority.INTERACTIVE)
    assert outlook is not None and not outlook.refuses(0.1)


def test_lower_classes_do_not_count_for_seats_they_give_way() -> None:
    # the cap of 8 is full, but with batch work only: it is displaced for the interactive request
    assert not stream_outlook(_stats(0, batch=8, max_running=8), Priority.INTERACTIVE).refuses(0.1)  # type: ignore[union-attr]
    full = stream_outlook(_stats(8, max_running=8), Priority.INTERACTIVE)
    assert full is not None and full.seats_full and full.refuses(None)


@pytest.fixture
def setup() -> Setup:
    return make_setup()


def test_the_controller_refuses_what_cannot_meet_both_targets(setup: Setup) -> None:
    """The issue's run: the TTFT prediction admitted requests that then waited 15-24 s for a seat."""
    quiet = tenant("quiet", Priority.INTERACTIVE, ttft_slo_ms=2_000)
    setup.engine_stats[0] = _stats(7, max_running=8)
    admit(setup, quiet, request(128, priority=Priority.INTERACTIVE))  # the eighth seat: fits
    with pytest.raises(ServiceUnavailableError) as info:
        admit(setup, quiet, request(128, priority=Priority.INTERACTIVE))  # a ninth would wait for a seat
    err = info.value
    assert err.status_code == 503 and err.code == "slo_unattainable"
    assert "time between tokens" in str(err) and "seat" in str(err)
    assert int(err.headers["retry-after"]) == 2  # about its TTFT target
    assert sample(setup, "weir_admission_rejected_total", tenant="quiet", reason="slo_unattainable") == 1
    # a row beside 17 running streams (and the one admitted above, unseen by this snapshot) would
    # make their steps 106 ms: refused, naming the step it would make
    setup.engine_stats[0] = _stats(17)
    with pytest.raises(ServiceUnavailableError, match="106 ms, over the objective of 100 ms"):
        admit(setup, quiet, request(16, priority=Priority.INTERACTIVE))
    # a tenant without a TTFT objective and lower classes are not judged on predictions
    admit(setup, tenant("other", Priority.INTERACTIVE), request(16, priority=Priority.INTERACTIVE))
    admit(setup, tenant("noisy", ttft_slo_ms=2_000), request(16))
