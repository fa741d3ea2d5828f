"""Progress: the scheduler never livelocks, whatever the pool, the budget and the mix of requests.

The state machine drives the real `Scheduler`, `KVCacheManager` (with and without a host tier),
`StepBudget` (fixed, or a target step time over a simulated cost that may make it small) and
`SpeculationPolicy` over a pool of a few blocks, with random arrivals of prompts of every size
that fits, n > 1 fork groups, speculative verdicts and aborts. The model is `sim.next_token`.

The invariant is progress: within a bounded number of steps every running request gains a token
(computed or sampled) or is preempted, and once arrivals stop every request finishes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.engine.sim import SimClock, next_token, sim_request
from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.kv.block_hash import CacheKeyRoot
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Priority, Request, RequestStatus
from weir.engine.scheduling.scheduler import Scheduler
from weir.engine.scheduling.speculation_policy import SpeculationPolicy
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig
from weir.engine.speculation_tally import VerifiedDraft
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

BS = 4
# A running request that neither gains a token nor is preempted for this many steps is stalled.
# Generous: a fixed budget smaller than the running decodes serves them in turn, not all at once.
MAX_IDLE_STEPS = 200
MAX_DRAIN_STEPS = 5_000


def _root(scope: str) -> bytes:
    return CacheKeyRoot("m", "t", "r", "float32", scope).digest()


class ProgressMachine(RuleBasedStateMachine):
    """Random arrivals, forks, aborts and steps over a tiny pool; every request always moves."""

    @initialize(
        num_blocks=st.integers(4, 24),
        host_blocks=st.sampled_from([0, 0, 4, 16]),
        caching=st.booleans(),
        max_tokens_per_step=st.integers(1, 48),
        max_seqs=st.integers(1, 8),
        chunk=st.sampled_from([0, 0, 3, 8]),
        speculate=st.booleans(),
        target_s=st.sampled_from([None, None, 0.05, 0.2, 1.0]),
        queue=st.sampled_from(list(QueuePolicy)),
        seed=st.integers(0, 2**16),
    )
    def setup(
        self,
        num_blocks: int,
        host_blocks: int,
        caching: bool,
        max_tokens_per_step: int,
        max_seqs: int,
        chunk: int,
        speculate: bool,
        target_s: float | None,
        queue: QueuePolicy,
        seed: int,
    ) -> None:
        self.kv = KVCacheManager(
            num_blocks + 1, BS, _root, enable_caching=caching, watermark=0.0, host_num_blocks=host_blocks
        )
        config = SchedulerConfig(
            max_num_batched_tokens=max_tokens_per_step,
            max_num_seqs=max_seqs,
            max_model_len=num_blocks * BS,
            long_prefill_threshold=chunk,
            queue_policy=queue,
            target_step_s=target_s,
        )
        self.clock = SimClock()
        budget = StepBudget(
            StepBudgetConfig(max_tokens=max_tokens_per_step, target_step_s=target_s, min_prefill_chunk=2)
        )
        self.sched = Scheduler(config, self.kv, clock=self.clock, step_budget=budget)
        if speculate:
            spec = SpeculativeConfig(SpeculativeMethod.NGRAM, 3, max_verify_tokens=16)
            self.sched.speculation = SpeculationPolicy(spec)
        self.rng = random.Random(seed)
        # A step costs more than the target can hold at times: the fitted budget turns small.
        self.step_cost: Callable[[int, int], float] = lambda tokens, decodes: (
            self.rng.uniform(0.5, 3.0) * (0.02 + 0.01 * decodes + 0.004 * (tokens - decodes))
        )
        self.num_added = 0
        self.num_steps = 0
        self.num_step_preemptions = 0
        preempt = self.kv.preempt

        def counted_preempt(req: Request, allow_swap: bool = True) -> object:
            # A livelock inside one `schedule()` call shows as preemptions without end: fail, not hang.
            self.num_step_preemptions += 1
            assert self.num_step_preemptions <= 2 * len(self.sched.requests) + 4, (
                "a step preempts without end"
            )
            return preempt(req, allow_swap)

        self.kv.preempt = counted_preempt  # type: ignore[method-assign]
        self.last_moved: dict[str, tuple[tuple[int, int, int], int]] = {}

    # -- arrivals ----------------------------------------------------------------------------

    def _pool_tokens(self) -> int:
        return self.kv.num_total_blocks * BS

    @rule(data=st.data(), priority=st.sampled_from(list(Priority)), tenant=st.sampled_from("abc"))
    def add(self, data: st.DataObject, priority: Priority, tenant: str) -> None:
        if len(self.sched.requests) >= 12:
            return
        pool = self._pool_tokens()
        prompt_len = data.draw(st.integers(1, pool - 1), "prompt length")
        max_tokens = data.draw(st.integers(1, min(12, pool - prompt_len)), "max tokens")
        prompt = data.draw(st.lists(st.integers(1, 5), min_size=prompt_len, max_size=prompt_len), "prompt")
        self.sched.add_request(self._request(prompt, max_tokens, tenant, priority))

    @rule(data=st.data(), n=st.integers(2, 4))
    def add_fork_group(self, data: st.DataObject, n: int) -> None:
        """n choices of one prompt, of a size the whole group fits the pool with (gateway-checked)."""
        if len(self.sched.requests) + n > 12:
            return
        pool_blocks = self.kv.num_total_blocks
        prompt_len = data.draw(st.integers(1, max(1, pool_blocks * BS // (n + 1))), "prompt length")
        max_tokens = data.draw(st.integers(1, 6), "max tokens")
        shared = prompt_len // BS
        own = self.kv.blocks_for(prompt_len + max_tokens) - shared
        if shared + n * own > pool_blocks:
            return
        prompt = data.draw(st.lists(st.integers(1, 5), min_size=prompt_len, max_size=prompt_len), "prompt")
        parent = self._request(prompt, max_tokens, "a", Priority.STANDARD)
        children = [self._request(prompt, max_tokens, "a", Priority.STANDARD) for _ in range(n - 1)]
        self.sched.add_fork_group(parent, children)

    def _request(self, prompt: list[int], max_tokens: int, tenant: str, priority: Priority) -> Request:
        rid = f"r{self.num_added}"
        self.num_added += 1
        return sim_request(
            rid,
            prompt,
            max_tokens,
            tenant_id=tenant,
            priority=priority,
            cache_scope=tenant,
            arrival_s=self.clock.now,
        )

    @precondition(lambda self: self.sched.has_unfinished())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sched.requests)))
        self.sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)

    # -- steps -------------------------------------------------------------------------------

    @precondition(lambda self: self.sched.has_unfinished())
    @rule(num_steps=st.integers(1, 8))
    def steps(self, num_steps: int) -> None:
        for _ in range(num_steps):
            self._step()

    def _step(self) -> None:
        self.num_step_preemptions = 0
        was_running = bool(self.sched.running)
        out = self.sched.schedule()
        # Each step moves: while any request runs, something is scheduled or someone is preempted.
        assert out.scheduled or out.preempted_ids or not was_running, "a step did nothing while requests ran"
        sampled: dict[str, int] = {}
        verified: dict[str, VerifiedDraft] = {}
        num_decodes = 0
        for s in out.scheduled:
            req = self.sched.requests[s.request_id]
            assert s.num_computed_tokens + s.num_tokens <= req.num_tokens
            assert len(s.block_ids) * BS >= s.num_computed_tokens + s.num_tokens + s.num_spec_slots
            if s.samples:
                sampled[s.request_id] = next_token(req.all_token_ids)
                num_decodes += s.num_tokens == 1
            if s.num_spec_slots:
                num_drafted = self.rng.randint(0, s.num_spec_slots)
                accepted = tuple(self.rng.randint(1, 5) for _ in range(self.rng.randint(0, num_drafted)))
                if num_drafted:
                    verified[s.request_id] = VerifiedDraft(num_drafted, accepted)
        self.sched.update_from_output(out, sampled, verified)
        num_tokens = sum(s.num_tokens + s.num_spec_slots for s in out.scheduled)
        if num_tokens:
            seconds = self.step_cost(num_tokens, num_decodes)
            self.sched.step_budget.observe(num_tokens, seconds, num_decodes)
            self.clock.now += seconds
        else:
            self.clock.now += 0.01
        self.num_steps += 1
        self._note_progress()

    def _note_progress(self) -> None:
        moved: dict[str, tuple[tuple[int, int, int], int]] = {}
        for rid, req in self.sched.running.items():
            state = (req.num_computed_tokens, req.num_tokens, req.num_preemptions)
            before = self.last_moved.get(rid)
            moved[rid] = (state, self.num_steps) if before is None or before[0] != state else before
        self.last_moved = moved

    @invariant()
    def admitted_prompts_hold_their_blocks(self) -> None:
        """Admission reserves a prompt's blocks: a running prompt needs at most one more block to reach
        its first token (a fork's own copy of the last, shared prompt block), so partial prefills can
        never hold the pool between them with none able to take its next chunk."""
        if not hasattr(self, "sched"):
            return
        for rid, req in self.sched.running.items():
            if req.num_computed_tokens < req.num_prompt_tokens:
                assert self.kv.blocks_for(req.num_prompt_tokens) - len(self.kv.blocks(rid)) <= 1, rid

    @invariant()
    def every_running_request_moves(self) -> None:
        for rid, (_, since) in getattr(self, "last_moved", {}).items():
            assert self.num_steps - since <= MAX_IDLE_STEPS, (
                f"{rid} ran {MAX_IDLE_STEPS} steps without progress"
            )

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for _ in range(MAX_DRAIN_STEPS):
            if not self.sched.has_unfinished():
                break
            self._step()
            self.every_running_request_moves()
        assert not self.sched.has_unfinished(), (
            f"livelock: running {list(self.sched.running)}, waiting {[r.request_id for r in self.sched.waiting]}, "
            f"free blocks {self.kv.num_free_blocks}"
        )
        assert self.kv.num_free_blocks == self.kv.num_total_blocks


TestProgress = ProgressMachine.TestCase
TestProgress.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
