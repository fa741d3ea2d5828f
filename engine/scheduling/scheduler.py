"""Iteration-level scheduler: decodes first, then chunked prefill within a token budget.

Every step it walks the running requests (decodes before prefill chunks), gives each the tokens
it needs within `max_num_batched_tokens`, preempting the lowest-ranked running request when KV
blocks run out, then admits waiting requests in queue order while their blocks fit
(engine/scheduling/admission.py: held-back duplicates, store fetches, displacement). A request's
progress is `num_computed_tokens`; there is no prefill flag. Plain Python, no torch.

The step's target time and rows are shaped by the latency targets (engine/scheduling/step_shaping.py);
who gives way when blocks or seats run out is engine/scheduling/preemption.py's. Forks: the other
choices of an n>1 request wait for the first one's prefill, then reference its blocks
(copy-on-write) instead of computing the prompt again; beam search forks running beams the same
way (engine/scheduling/fork_starts.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from weir.engine.config import SchedulerConfig
from weir.engine.errors import ContextLengthError
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.output import SchedulerOutput
from weir.engine.request import Priority, Request, RequestStatus
from weir.engine.scheduling.admission import Admission
from weir.engine.scheduling.batch_policy import make_batching
from weir.engine.scheduling.fork_starts import ForkStarts
from weir.engine.scheduling.preemption import Preemption
from weir.engine.scheduling.request_queue import WaitingQueue, make_waiting_queue
from weir.engine.scheduling.slo_standing import SloStanding
from weir.engine.scheduling.slo_tally import PreemptReason, SloTally
from weir.engine.scheduling.speculation_policy import SpeculationPolicy
from weir.engine.scheduling.step_budget import StepBudget, make_step_budget
from weir.engine.scheduling.step_plan import fair_shares, prefill_key, step_target_s
from weir.engine.scheduling.step_records import AppendedToken, StepDraft, StepUpdate
from weir.engine.scheduling.step_shaping import (
    StepState,
    first_answer_sit_outs,
    fit_decodes,
    goodput_target,
    ttft_need,
)
from weir.engine.speculation_tally import VerifiedDraft

logger = logging.getLogger("weir.engine")


class Scheduler:
    """Decides, each step, which requests run and how many tokens each feeds."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        clock: Callable[[], float] = time.monotonic,
        queue: WaitingQueue | None = None,
        step_budget: StepBudget | None = None,
    ) -> None:
        self.config = config
        # The token budget of each step: fixed, or following a target step time (engine/scheduling/step_budget.py).
        self.step_budget = step_budget if step_budget is not None else make_step_budget(config)
        # When waiting requests may join, and how many run at once (engine/scheduling/batch_policy.py).
        self.batching = make_batching(config)
        self.kv = kv
        self.clock = clock
        self.waiting: WaitingQueue = queue if queue is not None else make_waiting_queue(config.queue_policy)
        self.running: dict[str, Request] = {}  # insertion-ordered; O(1) removal
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        # n>1 choices awaiting their first choice's prefill, and beams forked at once.
        self.forks = ForkStarts(
            kv, self.requests, self.waiting, start_running=self._start_running, on_own=self._count_deadline
        )
        self._num_deadlines = 0  # requests with a queue deadline, so steps without any skip the scan
        self.speculation: SpeculationPolicy | None = None  # set by the engine when it speculates
        self.slo = SloTally()  # targets met per class and tenant, preemptions by reason
        self.num_steps = 0
        self.num_deferred_decodes = 0  # looser-class decodes that sat out a step for a tighter ITL
        self.slo_standing = SloStanding()  # which requests still meet both targets (the goodput trade)
        self._sat_out: set[str] = set()  # decodes that sat the last step out for a first answer
        # Who gives way when blocks or seats run out, and the residency that decides it.
        self.preemption = Preemption(config, kv, self.running, self.waiting, self.slo, lambda: self.num_steps)
        # Who joins the running set, held-back duplicates and parked store fetches.
        self.admission = Admission(
            config,
            kv,
            self.batching,
            self.step_budget,
            self.running,
            self.waiting,
            self.forks,
            self.preemption,
            start_running=lambda req: self._start_running(req, stamp=False),  # stamped once it feeds
            clock=clock,
        )

    # -- queue management -------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        """Queue a validated request. Raises ContextLengthError if it can never fit."""
        max_len = self.config.max_model_len
        ContextLengthError.check(req.num_prompt_tokens, req.sampling_params.max_tokens, max_len)
        if self.kv.blocks_for(req.num_prompt_tokens + 1) > self.kv.num_total_blocks:
            raise ContextLengthError(req.num_prompt_tokens, 1, self.kv.num_total_blocks * self.kv.block_size)
        self.requests[req.request_id] = req
        req.status = RequestStatus.WAITING
        req.latency = self.config.class_targets.resolve(req.priority, req.latency)
        self.waiting.add(req)
        self._count_deadline(req)

    def _count_deadline(self, req: Request) -> None:
        """`req` is a request of its own in the queue: steps scan for its deadline (`finish_request`
        counts it down)."""
        if req.deadline_s is not None:
            self._num_deadlines += 1

    def add_fork_group(self, parent: Request, children: list[Request]) -> None:
        """Queue `parent`; `children` (same prompt) fork from it once its prompt is computed.

        Each child then references the parent's prompt blocks and computes only the last prompt
        token itself, for its own sample; the partial last block is copied when first written.
        """
        if any(child.prompt_token_ids != parent.prompt_token_ids for child in children):
            raise ValueError("a fork must have its parent's prompt")
        self.add_request(parent)
        self.forks.add_group(parent, children)

    def fork_request(self, parent: Request, child: Request) -> None:
        """Start `child` running at once on `parent`'s blocks for its first `child.num_computed_tokens`
        tokens (beam search). Its tokens must begin with those of the parent."""
        self.forks.fork_now(parent, child)

    def _start_running(self, req: Request, stamp: bool = True) -> None:
        """Move `req` to the running set; `stamp`: it is scheduled now (see `RequestTimes`)."""
        req.status = RequestStatus.RUNNING
        self.running[req.request_id] = req
        self.preemption.started(req)
        self.waiting.on_running(req, +1)
        if stamp and req.times.first_scheduled_s is None:
            req.times.first_scheduled_s = self.clock()

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request (stopped, length, aborted, error) and free its blocks at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if self.forks.pending.drop_child(req):  # a fork still waiting for its parent's prefill
            req.status = status
            self._finished_ids.append(request_id)
            req.times.finished_s = self.clock()
            return req
        if self.forks.pending.is_parent(request_id):
            self.forks.release_children(req)
        if req.deadline_s is not None:
            self._num_deadlines -= 1
        self.preemption.forget(request_id)
        if self.running.pop(request_id, None) is not None:
            self.waiting.on_running(req, -1)
        elif self.admission.fetching.pop(request_id, None) is None:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
        self._finished_ids.append(request_id)
        req.times.finished_s = self.clock()
        self.slo.on_finished(req)
        return req

    @property
    def num_preemptions(self) -> int:
        return self.preemption.num_preemptions

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def running_by_priority(self) -> tuple[int, ...]:
        """Running sequences of each priority class (interactive, standard, batch)."""
        counts = [0] * len(Priority)
        for req in self.running.values():
            counts[int(req.priority)] += 1
        return tuple(counts)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- one step ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide the next step (the order and the step target: engine/scheduling/step_plan.py)."""
        self.num_steps += 1
        admission = self.admission
        admission.end_fetches()  # nothing without a store tier

        running = list(self.running.values())
        throughput_s = self.step_budget.config.target_step_s
        target_s = step_target_s(running, throughput_s)
        # Decodes by class (stable: admission order within one); prefill chunks by class, then
        # TTFT deadline, then admission order: the earliest prompt takes what the budget allows
        # first, and finishes first.
        # A sequence whose grammar mask is late sits out until it arrives (engine/runner/mask_prefetch.py).
        state = StepState(
            self.step_budget,
            self.waiting,
            self.slo_standing,
            self.requests,
            self.clock,
            throughput_s,
            decodes=sorted(
                (r for r in running if r.num_remaining == 1 and not r.awaits_mask),
                key=lambda r: int(r.priority),
            ),
            prefills=sorted((r for r in running if r.num_remaining > 1), key=prefill_key),
            head=self.waiting.peek(),
        )
        itl_s = target_s  # the tightest ITL running (at most the throughput step)
        if target_s is not None and state.prompts:
            target_s = goodput_target(state, target_s)
        if target_s is not None and (throughput_s is None or target_s < throughput_s):
            kept = fit_decodes(state, target_s)
            self.num_deferred_decodes += len(state.decodes) - len(kept)
            state.decodes = kept
        need = ttft_need(state, target_s)
        if target_s != itl_s:  # stretched for first tokens: the prompts get at least the minimum chunk
            need = max(need, self.step_budget.config.min_prefill_chunk)
        decodes, prefills, head = state.decodes, state.prefills, state.head
        budget = self.step_budget.budget(len(decodes), state.has_prefill_work, target_s, state.context, need)
        spec = self.speculation
        step = StepDraft(
            budget,
            chunk_cap=self.config.long_prefill_threshold or budget,
            spec_ok=spec is not None and spec.step_allows(len(decodes)),
        )
        self._feed(decodes, step)
        # Running prompts of a lower class than the waiting head wait for its admission.
        first = [r for r in prefills if head is None or r.priority <= head.priority]
        later = prefills[len(first) :]  # `prefills` is sorted by class: `first` is its head
        self._feed_fairly(first, step, head)
        admitted = False
        if later and not step.preempted and admission.may_admit():
            admission.admit(step)
            admitted = True
        self._feed_fairly(later, step, None)
        # Tokens given back by preempted victims scheduled earlier are not reused this step.

        if not admitted and not step.preempted and admission.may_admit():
            admission.admit(step)
        if step.budget > 0 and not step.preempted and len(self.waiting) and admission.may_admit():
            admission.displace_for_slo(step)
        if not step.scheduled and self.running and len(self.waiting):
            admission.unstall(step)
        scheduled = step.scheduled
        # Decode rows that sit this step out for another tenant's first answer (engine/scheduling/step_shaping.py).
        self._sat_out = first_answer_sit_outs(state, scheduled, step.spec_slots, self._sat_out)
        for rid in self._sat_out:
            del scheduled[rid]
        self.num_deferred_decodes += len(self._sat_out)

        out = step.output(self.requests, self.kv, self._finished_ids)
        self._finished_ids = []
        now = self.clock()
        for rid in scheduled:
            req = self.requests[rid]
            if req.times.first_scheduled_s is None:
                req.times.first_scheduled_s = now
        return out

    def _feed_fairly(self, prefills: list[Request], step: StepDraft, head: Request | None) -> None:
        """Feed prefill chunks class by class; within a class of several tenants, each tenant
        gets at most its weighted fair share of the budget left (engine/scheduling/step_plan.py). The
        waiting head counts as a tenant of its class: its share is left for its admission, so
        running prompts of one tenant cannot keep another tenant's request out of every step."""
        i = 0
        while i < len(prefills) and step.budget > 0:
            cls = prefills[i].priority
            j = i
            while j < len(prefills) and prefills[j].priority is cls:
                j += 1
            group = prefills[i:j]
            demands: dict[str, int] = {}
            weights: dict[str, float] = {}
            for r in group:
                demands[r.tenant_id] = demands.get(r.tenant_id, 0) + min(r.num_remaining, step.chunk_cap)
                weights[r.tenant_id] = r.weight
            if (
                head is not None
                and head.priority is cls
                and head.tenant_id not in demands
                and self.admission.may_seat(head)
            ):
                demands[head.tenant_id] = min(head.num_remaining, step.chunk_cap)
                weights[head.tenant_id] = head.weight
            limits = fair_shares(step.budget, demands, weights) if len(demands) > 1 else None
            self._feed(group, step, limits)
            i = j

    def _feed(self, reqs: list[Request], step: StepDraft, limits: dict[str, int] | None = None) -> None:
        """Give each running request of `reqs`, in order, the tokens it needs within the step's
        budget (and its tenant's `limits`), preempting the lowest-ranked running request when
        blocks run out."""
        scheduled, spec_slots, spec = step.scheduled, step.spec_slots, self.speculation
        for req in reqs:
            budget = step.budget
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            allowed = budget if limits is None else min(budget, limits.get(req.tenant_id, 0))
            if allowed <= 0:
                continue
            num_new = min(req.num_remaining, allowed, step.chunk_cap if req.num_remaining > 1 else 1)
            if spec is not None and (k := spec.reserve(req, self.kv, step.spec_ok, num_new, budget)):
                scheduled[req.request_id], spec_slots[req.request_id] = num_new, k
                step.budget -= num_new + k
                continue
            while not self.kv.allocate_slots(req, req.num_computed_tokens + num_new):
                if spec_slots:  # the draft slots reserved so far go before anyone is preempted
                    for rid, k in spec_slots.items():
                        held = self.requests[rid]
                        self.kv.truncate(held, held.num_computed_tokens + scheduled[rid])
                        step.budget += k
                    spec_slots.clear()
                    continue
                victim = self.preemption.lowest_ranked()
                self.preemption.preempt(victim, reason=PreemptReason.KV)
                step.drop(victim, refund=False)
                if victim is req:
                    break
            else:
                scheduled[req.request_id] = num_new
                step.budget -= num_new
                if limits is not None:
                    limits[req.tenant_id] -= num_new

    def has_work(self) -> bool:
        """Whether a step should feed tokens: requests run, or (continuous batching) wait to be admitted.

        Static and dynamic batches may rightly wait for their window with nothing running."""
        if self.running:
            return True
        return bool(len(self.waiting)) and not self.batching.forms_groups

    def describe(self) -> str:
        """The scheduler's state in one line per running request, for the stall watchdog's log."""
        lines = [
            f"running {len(self.running)}, waiting {len(self.waiting)}, free blocks "
            f"{self.kv.num_free_blocks}/{self.kv.num_total_blocks}, budget {self.step_budget.last_budget}, "
            f"running cap {self.step_budget.max_running()}, pending forks {len(self.forks)}, "
            f"fetching KV {len(self.admission.fetching)}"
        ]
        for req in self.running.values():
            lines.append(
                f"  {req.request_id}: {req.status.name} computed {req.num_computed_tokens}/{req.num_tokens} "
                f"(prompt {req.num_prompt_tokens}), blocks {len(self.kv.blocks(req.request_id))}, "
                f"class {req.priority.name}, preempted {req.num_preemptions}x"
            )
        return "\n".join(lines)

    # -- after the step ---------------------------------------------------------------------

    def update_from_output(
        self,
        out: SchedulerOutput,
        sampled: Mapping[str, int],
        verified: Mapping[str, VerifiedDraft] | None = None,
        sat_out: Collection[str] = (),
    ) -> StepUpdate:
        """Apply an executed step to its requests: the one place a step's results change them.

        Every scheduled request still here advances `num_computed_tokens` and caches its full
        blocks (a parent whose prompt is now computed starts its forks). Then each token of
        `sampled` (request id -> token id; sequences with a `checker`, not beams, whose group
        appends their tokens) is appended after its stop checks, and a request that ended is
        finished and its blocks freed. A request whose checks raise is left for the caller to fail.

        `verified` (speculation): accepted drafts are appended (and checked) before the sampled
        token, each counted as computed; then rejected slots are truncated and only then are full
        blocks cached, so a draft token is never hashed into the prefix cache.

        `sat_out`: sampling requests the step fed but could not sample (their grammar mask was
        late): their last fed position is not counted, so the next step feeds it again and samples.
        """
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None:
                continue  # aborted while the step ran
            req.num_computed_tokens += s.num_tokens - (s.request_id in sat_out)
            self.kv.cache_full_blocks(req)
            self.waiting.on_tokens_served(req, s.num_tokens)
            if self.forks and req.num_computed_tokens >= req.num_prompt_tokens:
                self.forks.start_children(req)
        update = StepUpdate()
        now = self.clock()
        for rid, token_id in sampled.items():
            req = self.requests.get(rid)
            if req is None:
                continue
            accepted = verified[rid].accepted if verified and rid in verified else ()
            for i, tok in enumerate((*accepted, token_id)):
                try:
                    delta = req.append_token(tok, now)
                except Exception as exc:  # this request's detokenization or stop checks
                    logger.exception("processing the output of request %s failed", rid)
                    update.failed[rid] = f"{type(exc).__name__}: {exc}"
                    break
                req.num_computed_tokens += i < len(accepted)  # an accepted draft's KV is cached
                update.appended.append(AppendedToken(req, tok, delta))
                if delta.finish_reason is not None:
                    self.finish_request(rid, delta.finish_reason.status)
                    break
        if self.speculation is not None:  # counts, then rejected slots truncated, then caching
            self.speculation.after_step(out, verified or {}, [a.request for a in update.appended], self.kv)
        return update

    def expire_deadlines(self) -> list[Request]:
        """Abort waiting requests whose queue deadline has passed; their blocks are freed now.

        The queue deadline bounds the wait before a request first starts. A request that has
        been scheduled once (and maybe streamed tokens) and was then preempted or requeued is
        never expired as "waited in the queue".
        """
        if not self._num_deadlines:
            return []
        now = self.clock()
        expired = [r for r in self.waiting if (d := _queued_deadline(r)) is not None and d <= now]
        for req in expired:
            self.finish_request(req.request_id, RequestStatus.FINISHED_ABORTED)
        return expired

    def idle_timeout_s(self, default_s: float) -> float:
        """How long the engine may sleep after a step that scheduled nothing.

        Only time changes what an idle scheduler decides: a queue deadline passing, or a static
        or dynamic batch's wait ending. Anything else (a new request, an abort) wakes the engine.
        """
        now = self.clock()
        timeout = default_s
        store = self.kv.store
        fetch_deadline = store.next_deadline_s() if store is not None else None
        if fetch_deadline is not None:
            timeout = min(timeout, fetch_deadline - now)
        if self._num_deadlines:
            for req in self.waiting:
                deadline = _queued_deadline(req)
                if deadline is not None:
                    timeout = min(timeout, deadline - now)
        head = self.waiting.peek() if self.batching.forms_groups else None
        window_end_s = self.batching.window_end_s(head) if head is not None else None
        if window_end_s is not None:
            timeout = min(timeout, window_end_s - now)
        return max(0.0, timeout)


def _queued_deadline(req: Request) -> float | None:
    """The queue deadline of a request that has never been scheduled; None otherwise."""
    if req.deadline_s is None or req.times.first_scheduled_s is not None:
        return None
    return req.deadline_s
