"""Admission: which waiting requests join the running set this step, and who makes room for them.

`admit` takes waiting requests in queue order while seats (the batch mode's `max_num_seqs`, the
step budget's running cap) and the step's token budget allow, and reserves blocks for each
one's whole known sequence, so a prompt never stalls half-way. When its blocks do not fit, a
running request of a lower class or of a tenant over its share of the pool is displaced
(`Preemption.victim_for_blocks`). `displace_for_slo` does the same for a waiting head the
running cap keeps out (a lower class once the head has waited a share of its TTFT target, or
the tenant most over its share of the seats), and `unstall` preempts idle sequences when
nothing else could step. A displaced victim sits out the rest of that admission (issue 29:
back at the head of its queue it would be admitted and displaced again, for ever).

Prefix sharing within a step: under continuous batching a request whose next uncached block
is being computed by a running request right now is held back a step (`num_held_back`), so the
block is computed once. KV store: a request whose prefix the KV manager decides to fetch parks
in `fetching` (FETCHING_KV) while its blocks arrive; `end_fetches` puts it back at the head of
its queue once the fetch ended, and it is admitted on what landed. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable

from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Request, RequestStatus
from weir.engine.scheduling.batch_policy import Batching
from weir.engine.scheduling.fork_starts import ForkStarts
from weir.engine.scheduling.preemption import Preemption
from weir.engine.scheduling.request_queue import WaitingQueue
from weir.engine.scheduling.slo_tally import PreemptReason
from weir.engine.scheduling.step_budget import StepBudget
from weir.engine.scheduling.step_records import StepDraft


class Admission:
    """Admits waiting requests into the scheduler's running set (shared, not copied)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        batching: Batching,
        step_budget: StepBudget,
        running: dict[str, Request],
        waiting: WaitingQueue,
        forks: ForkStarts,
        preemption: Preemption,
        start_running: Callable[[Request], None],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.kv = kv
        self.batching = batching
        self.step_budget = step_budget
        self._running = running
        self._waiting = waiting
        self._forks = forks
        self._preemption = preemption
        self._start_running = start_running  # the scheduler's: status, running set, residency
        self._clock = clock
        self.num_held_back = 0  # admissions deferred because the same block was being computed
        self.fetching: dict[str, tuple[Request, RequestStatus]] = {}  # id -> (request, status before)

    def may_admit(self) -> bool:
        """Whether the batch mode lets waiting requests join now."""
        return self.batching.may_admit(self._waiting, len(self._running), self._clock)

    def may_seat(self, head: Request) -> bool:
        """Whether `head` could be admitted this step as far as seats go (no budget share is kept
        for a request the running cap keeps out anyway: that would waste the step)."""
        max_seqs = self.config.max_num_seqs
        return (
            self.may_admit()
            and len(self._running) + min(self._forks.num_seats(head), max_seqs) <= max_seqs
            and self.step_budget.admits(len(self._running))
        )

    def admit(self, step: StepDraft) -> None:
        """Admit waiting requests in queue order while seats, blocks and the step's budget allow."""
        running, waiting, kv = self._running, self._waiting, self.kv
        max_seqs = self.batching.max_seqs
        # Continuous batching stops admitting when the budget is spent; static and dynamic
        # batches admit the whole group now and feed its prompts over the next steps.
        group = self.batching.forms_groups
        # Holding a request back one step is free under continuous batching; a static batch
        # would leave it out until the whole batch ends, so there duplicates are computed.
        may_hold = not group and kv.enable_caching
        held: list[Request] = []
        displaced: list[Request] = []  # preempted for a higher class during this admission
        # A target step time also caps how many run at once (StepBudget.admits): past it, requests wait.
        admits = self.step_budget.admits
        while len(running) < max_seqs and (group or (step.budget > 0 and admits(len(running)))):
            req = waiting.peek()
            if req is None:
                break
            # A swapped-out request comes back with its blocks from the host tier.
            swapped = req.status is RequestStatus.SWAPPED
            computed, num_cached = ([], 0) if swapped else kv.get_computed_blocks(req)
            if not swapped and kv.start_fetch(req, num_cached):
                waiting.remove(req)  # it waits for its blocks out of the queue; others step on
                self.fetching[req.request_id] = (req, req.status)
                req.status = RequestStatus.FETCHING_KV
                continue
            if not swapped and may_hold and kv.lookup.inflight_owner(req, num_cached) is not None:
                waiting.remove(req)
                held.append(req)
                self.num_held_back += 1
                if len(held) >= 2 * max_seqs:
                    break
                continue
            if len(running) + min(self._forks.num_seats(req), max_seqs) > max_seqs:
                break  # the request's forks need seats too
            # Admission reserves blocks for the whole known sequence, so a prompt never stalls.
            if swapped:
                fits = kv.swap_in(req, watermark=True)
            else:
                fits = kv.allocate_slots(req, req.num_tokens, computed, watermark=True)
            if not fits:
                victim, reason = self._preemption.victim_for_blocks(req)
                if victim is None:
                    break
                self._displace(victim, reason, step)
                displaced.append(victim)
                continue
            waiting.remove(req)
            if not swapped:
                if req.num_preemptions == 0:
                    req.num_cached_tokens = num_cached
                    kv.lookup.record_lookup(req, num_cached)
                req.num_computed_tokens = num_cached
                kv.mark_inflight(req)
            self._start_running(req)  # schedule() stamps it once it feeds tokens
            num_new = min(req.num_remaining, step.budget, step.chunk_cap)
            if num_new > 0:
                step.scheduled[req.request_id] = num_new
                step.budget -= num_new
        for req in reversed(held):
            waiting.prepend(req)
        for req in reversed(displaced):
            waiting.prepend(req)

    def displace_for_slo(self, step: StepDraft) -> None:
        """The waiting head is kept out by the running cap. Preempt one running request and admit
        again: a lower-class one (least advanced, resident for at least `min_residency_steps`)
        when the head has used up a share of its TTFT target waiting; else, when the head's
        tenant is under its share of its class's seats, one of the tenant most over its share
        (`Preemption.victim_for_seat`). One per step: the cap is not chased."""
        head = self._waiting.peek()
        if head is None or self.config.queue_policy is QueuePolicy.FCFS:
            return
        victim, reason = self._preemption.victim_for_seat(
            head, self._clock(), self.may_seat(head), self._forks.num_seats(head)
        )
        if victim is not None:
            self._displace(victim, reason, step)
            self.admit(step)
            self._waiting.prepend(victim)

    def unstall(self, step: StepDraft) -> None:
        """Only idle sequences hold blocks (beams waiting for a sibling that was preempted) and the
        waiting ones cannot get any: preempt idle ones until a waiting request is admitted.

        The victims sit out this step's admission (else the first would just come back), and
        recompute later, mostly from the prefix cache. Without this no step would do anything.
        """
        victims: list[Request] = []
        while not step.scheduled and self._running and len(self._waiting):
            victim = self._preemption.lowest_ranked()
            self._displace(victim, PreemptReason.STALL, step)
            victims.append(victim)
            if len(self._waiting):
                self.admit(step)
        for victim in reversed(victims):
            self._waiting.prepend(victim)

    def _displace(self, victim: Request, reason: PreemptReason, step: StepDraft) -> None:
        """Preempt `victim` for a waiting request; it sits out the rest of this admission (back at
        the head of its queue it would be admitted again and displaced again, for ever: issue
        29). The caller puts it back at the head once the admission is over."""
        self._preemption.preempt(victim, reason=reason)
        step.drop(victim, refund=True)
        self._waiting.remove(victim)

    def end_fetches(self) -> None:
        """Requests whose store fetch ended go back to the head of their queue."""
        if self.kv.store is None:
            return
        for rid in self.kv.store.poll():
            entry = self.fetching.pop(rid, None)
            if entry is not None:
                req, status = entry
                req.status = status
                self._waiting.prepend(req)
