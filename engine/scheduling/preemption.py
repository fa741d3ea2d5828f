"""Preemption: which running request gives way, and what giving way does to it.

A running request is displaced for one of four reasons (`PreemptReason`): the KV blocks ran out
while feeding the step (the lowest-ranked running request goes), a request of a tighter class
needs its blocks, or its seat once it has waited `SLO_URGENCY` of its TTFT target (a strictly
lower class goes), a tenant under its fair share of the pool or the seats needs room (the
tenant most over its share gives a request, `share_victim`), or nothing can step at all (a
stall). Victims of a class or a share must be `settled` (resident
for `min_residency_steps`) and, for a share, have computed past what they held when they were
last preempted: two tenants each needing most of the pool would otherwise displace each other
just before each one's next token, for ever.

`preempt` swaps the victim's KV to the host tier or drops it (the KV manager's cost model
picks) and puts it back at the head of its queue. The engine preempts too: to break a stall
the watchdog saw (`break_stall`), and after a failed model forward, whose KV and swaps are not
trusted (`requeue`, `discard_swaps`): those victims recompute. Plain Python over the
scheduler's running set and queue; no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from weir.engine.config import PreemptionMode, QueuePolicy, SchedulerConfig
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.output import SchedulerOutput
from weir.engine.request import Request, RequestStatus
from weir.engine.scheduling.request_queue import WaitingQueue
from weir.engine.scheduling.slo_tally import PreemptReason, SloTally
from weir.engine.scheduling.step_plan import share_victim

# A waiting request may displace a lower class past the running cap once it has waited this
# share of its TTFT target (not at once: a wait that ends by itself soon costs no preemption).
SLO_URGENCY = 0.25


class Preemption:
    """Victim choice and preemption over the scheduler's running set (shared, not copied)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        running: dict[str, Request],
        waiting: WaitingQueue,
        slo: SloTally,
        num_steps: Callable[[], int],
    ) -> None:
        self.config = config
        self.kv = kv
        self._running = running
        self._waiting = waiting
        self._slo = slo
        self._num_steps = num_steps
        self.num_preemptions = 0
        self._resident_since: dict[str, int] = {}  # running id -> step it started or resumed
        # preempted id -> tokens it held then: not displaced for a fair share again before it
        # has computed past them
        self._held_at_preemption: dict[str, int] = {}

    # -- residency --------------------------------------------------------------------------

    def started(self, req: Request) -> None:
        """`req` runs (again) from this step on."""
        self._resident_since[req.request_id] = self._num_steps()

    def stopped(self, request_id: str) -> None:
        """The request left the running set."""
        self._resident_since.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """The request ended."""
        self._resident_since.pop(request_id, None)
        self._held_at_preemption.pop(request_id, None)

    def settled(self, req: Request) -> bool:
        """Whether `req` has run `min_residency_steps` since it last started (it may be preempted)."""
        since = self._resident_since.get(req.request_id, 0)
        return self._num_steps() - since >= self.config.min_residency_steps

    def may_share_preempt(self, req: Request) -> bool:
        """Whether `req` may be displaced for another tenant's fair share: it is `settled` and has
        computed past what it held when it was last preempted (each residency yields a token)."""
        return self.settled(req) and req.num_computed_tokens >= self._held_at_preemption.get(
            req.request_id, 0
        )

    # -- victims ----------------------------------------------------------------------------

    def lowest_ranked(self) -> Request:
        """The running request the queue ranks last (its `victim_key`)."""
        return max(self._running.values(), key=self._waiting.victim_key)

    def victim_for_blocks(self, req: Request) -> tuple[Request | None, PreemptReason]:
        """Who gives `req` the blocks it needs at admission: a running request of a strictly lower
        class, else (fair or priority queue) one of the tenant most over its share of the pool."""
        if self.config.queue_policy is QueuePolicy.FCFS:
            return None, PreemptReason.CLASS
        if self._running and (lowest := self.lowest_ranked()).priority > req.priority:
            return lowest, PreemptReason.CLASS
        need = self.kv.blocks_for(req.num_tokens)
        victim = share_victim(req, self._running.values(), self._num_blocks, need, self.may_share_preempt)
        return victim, PreemptReason.FAIR_SHARE

    def victim_for_seat(
        self, head: Request, now: float, may_seat: bool, seats: int
    ) -> tuple[Request | None, PreemptReason]:
        """Who gives the waiting `head` a seat the running cap keeps from it: a settled request of
        a lower class when it is urgent (it has waited `SLO_URGENCY` of its TTFT target by `now`),
        else, when it could not be seated, one of the tenant most over its share of the seats."""
        ttft = head.latency.ttft_s
        if ttft is not None and now - head.arrival_s >= SLO_URGENCY * ttft:
            lower = [r for r in self._running.values() if r.priority > head.priority and self.settled(r)]
            if lower:
                victim = max(lower, key=lambda r: (int(r.priority), -r.num_computed_tokens, r.arrival_s))
                return victim, PreemptReason.SLO
        if may_seat:
            return None, PreemptReason.FAIR_SHARE
        over_share = share_victim(head, self._running.values(), _one_seat, seats, self.may_share_preempt)
        return over_share, PreemptReason.FAIR_SHARE

    def _num_blocks(self, req: Request) -> int:
        return len(self.kv.block_ids(req.request_id))

    # -- preempting -------------------------------------------------------------------------

    def preempt(
        self, req: Request, allow_swap: bool = True, reason: PreemptReason = PreemptReason.KV
    ) -> None:
        """Swap the KV blocks to the host tier or drop them (the KV manager's cost model picks),
        and go back to the front of the queue."""
        self._slo.on_preempted(reason)
        del self._running[req.request_id]
        self._held_at_preemption[req.request_id] = req.num_tokens
        self._resident_since.pop(req.request_id, None)
        self._waiting.on_running(req, -1)
        if self.kv.preempt(req, allow_swap) is PreemptionMode.SWAP:
            req.status = RequestStatus.SWAPPED  # keeps num_computed_tokens; swapped in before it runs
        else:
            req.num_computed_tokens = 0
            req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.prepend(req)

    def break_stall(self) -> Request | None:
        """Preempt the lowest-ranked running request (it recomputes), so the waiting ones get its blocks."""
        if not self._running:
            return None
        victim = self.lowest_ranked()
        self.preempt(victim, allow_swap=False, reason=PreemptReason.STALL)
        return victim

    def requeue(self, req: Request) -> None:
        """Put a running request back at the front of the queue; it recomputes its blocks.

        After a failed model forward: the blocks written in that step are not trusted.
        """
        self.preempt(req, allow_swap=False, reason=PreemptReason.REQUEUE)

    def discard_swaps(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> None:
        """`out`'s step failed: its copies may not have run. Its swapped-out victims and the
        requests its swap-ins filled (of `requests`, the scheduler's) recompute instead; the blocks
        it filled lose their hashes."""
        for rid in (*out.preempted_ids, *out.swaps.swapped_in_ids) if not out.swaps.is_empty else ():
            req = requests.get(rid)
            if req is not None and req.status is RequestStatus.SWAPPED:
                self.kv.drop_swapped(req)
                req.num_computed_tokens = 0
                req.status = RequestStatus.PREEMPTED
            elif req is not None and req.status is RequestStatus.RUNNING and rid in out.swaps.swapped_in_ids:
                self.requeue(req)
        if not out.swaps.is_empty:
            self.kv.copy_plan.forget_transfers(out.swaps)


def _one_seat(req: Request) -> int:
    return 1
