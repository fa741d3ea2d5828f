"""The engine step's side of speculative decoding: ask the drafter, hand verdicts on.

`LLMEngine.step` calls these between the scheduler and the runner, and between the runner and
`Scheduler.update_from_output`, so its own body stays one line per concern.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from weir.engine.output import SchedulerOutput
from weir.engine.request import Request
from weir.engine.runner.runner import StepResult
from weir.engine.sampling.draft_verifier import Draft
from weir.engine.sampling.sampler import SampleResult
from weir.engine.scheduling.step_records import AppendedToken
from weir.engine.spec_decode.drafter import Drafter
from weir.engine.speculation_tally import VerifiedDraft

logger = logging.getLogger("weir.engine")


def propose(
    drafter: Drafter | None, out: SchedulerOutput, requests: Mapping[str, Request]
) -> dict[str, Draft] | None:
    """The drafter's proposals for the step's draft slots. A drafter that raises costs the step
    its speculation, never a request: the step then runs as plain decodes."""
    if drafter is None:
        return None
    try:
        return drafter.propose(out, requests)
    except Exception:
        logger.exception("drafting failed; this step runs without speculation")
        return None


def verdicts(result: StepResult, sampled: Mapping[str, SampleResult]) -> dict[str, VerifiedDraft]:
    """What the scheduler applies for each verified request among `sampled` (token ids only)."""
    return {
        rid: VerifiedDraft(v.num_drafted, tuple(a.token_id for a in v.accepted))
        for rid, v in result.verified.items()
        if rid in sampled
    }


def appended_results(
    appended: Sequence[AppendedToken], result: StepResult, sampled: Mapping[str, SampleResult]
) -> list[SampleResult]:
    """The `SampleResult` (token and logprobs) of each appended token, in order: a verify step
    appends its accepted drafts first, then the sampled token."""
    num_seen: dict[str, int] = {}
    out: list[SampleResult] = []
    for a in appended:
        rid = a.request.request_id
        i = num_seen[rid] = num_seen.get(rid, -1) + 1
        v = result.verified.get(rid)
        out.append(v.accepted[i] if v is not None and i < len(v.accepted) else sampled[rid])
    return out


def num_tokens_fed(out: SchedulerOutput, result: StepResult) -> int:
    """Tokens the step's forward processed: the scheduled ones and the verified drafts."""
    return out.num_tokens + sum(v.num_drafted for v in result.verified.values())
