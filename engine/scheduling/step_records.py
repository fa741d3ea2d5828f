"""The records of one step: the draft the scheduler plans, and what applying the step did.

`StepDraft` is the step being planned, one object passed through every phase of
`Scheduler.schedule` (feeding decodes, prefill chunks, admission, displacement): the tokens it
may still feed, what it feeds each request, the draft slots reserved after decodes, and the
requests preempted in it; once planned, it becomes the `SchedulerOutput` the runner executes. `StepUpdate` is what `Scheduler.update_from_output` did with the
executed step: the tokens appended, in order (`AppendedToken`), and the requests it could not
update. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.output import ScheduledRequest, SchedulerOutput
from weir.engine.request import Request, TokenDelta


@dataclass
class StepDraft:
    """One step being planned: the tokens it may still feed, what it feeds each request, the
    draft slots reserved after decodes, and the requests preempted in it."""

    budget: int
    chunk_cap: int  # the most tokens one prompt feeds in the step
    spec_ok: bool = False  # the step may speculate
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens fed
    spec_slots: dict[str, int] = field(default_factory=dict)  # decode id -> draft slots after its token
    preempted: list[str] = field(default_factory=list)

    def drop(self, victim: Request, refund: bool) -> None:
        """`victim` was preempted: it feeds nothing in this step; `refund`: its tokens may go to
        others in this admission (while feeding running requests they are not reused)."""
        self.preempted.append(victim.request_id)  # SchedulerOutput lists every preemption
        tokens = self.scheduled.pop(victim.request_id, 0)
        self.spec_slots.pop(victim.request_id, None)
        if refund:
            self.budget += tokens

    def output(
        self, requests: Mapping[str, Request], kv: KVCacheManager, finished_ids: Sequence[str]
    ) -> SchedulerOutput:
        """The planned step for the runner: each scheduled request's tokens and block table, the
        preempted and `finished_ids` requests, and the block copies and transfers the KV cache
        manager decided since the last step (taken from it)."""
        return SchedulerOutput(
            scheduled=tuple(
                ScheduledRequest(
                    request_id=rid,
                    num_tokens=n,
                    num_computed_tokens=requests[rid].num_computed_tokens,
                    block_ids=kv.block_ids(rid),
                    samples=requests[rid].num_computed_tokens + n == requests[rid].num_tokens,
                    num_spec_slots=self.spec_slots.get(rid, 0),
                )
                for rid, n in self.scheduled.items()
            ),
            preempted_ids=tuple(self.preempted),
            finished_ids=tuple(finished_ids),
            blocks_to_copy=kv.copy_plan.take_copies(),
            swaps=kv.copy_plan.take_transfers(),
        )


@dataclass(frozen=True)
class AppendedToken:
    """A token appended to a request by `Scheduler.update_from_output`, with what it added."""

    request: Request
    token_id: int
    delta: TokenDelta


@dataclass
class StepUpdate:
    """What `Scheduler.update_from_output` did: tokens appended (in order), requests it could not update."""

    appended: list[AppendedToken] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # request id -> error, for that request only
