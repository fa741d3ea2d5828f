"""The speculation policy's adaptive k: slots that never get a draft stop costing the step k."""

from __future__ import annotations

from tests.engine.scheduling.test_scheduler_spec import K, _kv, _request, _scheduler
from weir.engine.speculation_tally import VerifiedDraft


def test_slots_that_get_no_draft_shrink_to_one() -> None:
    """A request whose drafter finds nothing (no n-gram match) held k slots of every step's token
    budget for its whole life; now each such step counts as a full rejection."""
    scheduler = _scheduler(_kv())
    req = _request("a", list(range(10)), 50)
    scheduler.add_request(req)
    scheduler.update_from_output(scheduler.schedule(), {"a": 50})  # the prompt
    slots = []
    for token in range(51, 56):
        out = scheduler.schedule()
        slots.append(out.scheduled[0].num_spec_slots)
        scheduler.update_from_output(out, {"a": token})  # no draft proposed: nothing verified
    assert slots[0] == K and slots[-1] == 1
    assert req.spec.num_drafted == 0
    # Accepted drafts bring the slots back.
    for token in range(60, 78, 3):
        out = scheduler.schedule()
        k = out.scheduled[0].num_spec_slots
        drafts = tuple(range(token, token + k))
        scheduler.update_from_output(out, {"a": token + k}, {"a": VerifiedDraft(k, drafts)})
    assert scheduler.schedule().scheduled[0].num_spec_slots == K
