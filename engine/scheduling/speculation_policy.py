"""How many draft slots each decode gets in a step. Plain Python, no torch (the scheduler asks it).

Rules, in order:
- only sampled sequences speculate (beams never do), and not when the request opted out
  (`SamplingParams.speculative` False) or has one token left to produce (`max_tokens`);
- the batch rule: a step whose decodes would verify more than `max_verify_tokens` tokens
  (decodes x (1 + k)) speculates for nobody, because past that the forward is no longer
  memory-bound and verifying drafts costs more than it saves. Seeded sampled requests are
  exempt, so that their draws, and so their tokens, do not depend on the load;
- adaptive k: a request gets one slot more than its running mean of accepted tokens per step
  with slots (rounded up), at least 1 and at most k. It starts at k; while its drafts are rejected,
  or its slots get no draft (the n-gram drafter finds no match), it falls towards 1, and it climbs
  back as drafts are accepted. Slots are taken from the step's token budget before drafting, so a
  request that never drafts holds one slot per step, not k.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.output import SchedulerOutput
from weir.engine.request import Request
from weir.engine.speculation_tally import SpeculationCounters, VerifiedDraft
from weir.engine.speculative_config import SpeculativeConfig


class SpeculationPolicy:
    """Decides draft slots per request and step, and keeps the engine's speculation counters."""

    def __init__(self, config: SpeculativeConfig, counters: SpeculationCounters | None = None) -> None:
        self.config = config
        self.counters = counters if counters is not None else SpeculationCounters()

    def step_allows(self, num_decodes: int) -> bool:
        """The batch rule: whether a step with `num_decodes` decodes may speculate."""
        allowed = num_decodes * (1 + self.config.num_speculative_tokens) <= self.config.max_verify_tokens
        if not allowed and num_decodes:
            self.counters.num_steps_off_by_batch += 1
        return allowed

    def num_slots(self, req: Request, step_allows: bool, budget: int) -> int:
        """Draft slots for decode `req` this step, within `budget` extra tokens (0: no speculation)."""
        sp = req.sampling_params
        # A constrained sequence is not speculated: drafts would need the matcher rolled back.
        if sp.use_beam_search or sp.speculative is False or req.checker is None or req.constraint is not None:
            return 0
        exempt = sp.seed is not None and not sp.is_greedy
        if not step_allows and not exempt:
            return 0
        k = self.config.num_speculative_tokens
        recent = req.spec.recent_accepted
        if recent is not None:
            k = max(1, min(k, math.ceil(recent) + 1))
        # The token sampled after the drafts is the last one `max_tokens` allows at most.
        left = sp.max_tokens - req.num_output_tokens - 1
        return max(0, min(k, left, budget))

    def reserve(self, req: Request, kv: KVCacheManager, step_allows: bool, num_new: int, budget: int) -> int:
        """Allocate the draft slots of decode `req` after its `num_new` tokens; how many (0: none).

        Slots come from free blocks only: a short pool drops them before it preempts anyone.
        """
        if req.num_remaining != 1:
            return 0
        k = self.num_slots(req, step_allows, budget - num_new)
        if k and kv.allocate_slots(req, req.num_computed_tokens + num_new + k):
            return k
        return 0

    def after_step(
        self,
        out: SchedulerOutput,
        verified: Mapping[str, VerifiedDraft],
        appended: Sequence[Request],
        kv: KVCacheManager,
    ) -> None:
        """After `Scheduler.update_from_output` appended a step's tokens (`appended`: the request of
        each token, in order): count each verify step, give back the slots of rejected (or never
        proposed) drafts, and only then cache the full blocks, so a draft is never hashed."""
        by_id = {r.request_id: r for r in appended}
        num_emitted = Counter(r.request_id for r in appended)
        for rid, req in by_id.items():
            if (v := verified.get(rid)) is not None:
                req.spec.observe(v.num_drafted, len(v.accepted), num_emitted[rid])
                self.counters.add(v.num_drafted, len(v.accepted), num_emitted[rid])
        for s in out.scheduled:
            held = by_id.get(s.request_id)
            if s.num_spec_slots and held is not None and s.request_id not in verified:
                held.spec.fold(0)  # slots that got no draft: as many accepted as a full rejection
            if s.num_spec_slots and held is not None and not held.is_finished:
                kv.truncate(held, held.num_tokens)
                kv.cache_full_blocks(held)
