"""Speculative decoding in the scheduler and the KV cache manager: draft slots, rollback, accounting.

The state machine runs the real `Scheduler`, `KVCacheManager` and `SpeculationPolicy` over a tiny
pool; the model's verdicts (how many of the drafts were accepted, which token follows) are drawn
by hypothesis, including aborts between scheduling a verify step and applying it. After every step:
each block's ref count equals the tables holding it, free + held blocks = the pool, each running
request holds between the blocks of its computed and of its known tokens, and every cached block a
request holds lies inside its computed tokens and carries the hash of its real tokens (a draft
token is never hashed).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.engine.config import SchedulerConfig
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Request, RequestStatus, SamplingParams
from weir.engine.scheduling.scheduler import Scheduler
from weir.engine.scheduling.speculation_policy import SpeculationPolicy
from weir.engine.speculation_tally import VerifiedDraft
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod
from weir.engine.text.output_processor import OutputProcessor

BS = 4
K = 3


def _kv(num_blocks: int = 28) -> KVCacheManager:
    return KVCacheManager(
        num_blocks, BS, lambda scope: hashlib.sha256(scope.encode()).digest(), watermark=0.0
    )


def _scheduler(kv: KVCacheManager, max_verify_tokens: int = 1000) -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=64), kv)
    config = SpeculativeConfig(SpeculativeMethod.NGRAM, K, max_verify_tokens=max_verify_tokens)
    scheduler.speculation = SpeculationPolicy(config)
    return scheduler


def _request(rid: str, prompt: list[int], max_tokens: int, **params: object) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **params)  # type: ignore[arg-type]
    return Request(rid, prompt, sp, checker=OutputProcessor(None, prompt, sp, ()))


def test_truncate_frees_whole_blocks_past_the_kept_tokens() -> None:
    kv = _kv()
    req = _request("a", list(range(6)), 20)
    assert kv.allocate_slots(req, 6 + 1 + 8)  # the last token and 8 draft slots: 15 tokens, 4 blocks
    req.num_computed_tokens = 7
    free = kv.num_free_blocks
    assert kv.truncate(req, 8) == 2  # 8 tokens need 2 blocks
    assert kv.num_free_blocks == free + 2
    assert len(kv.blocks("a")) == 2
    assert kv.truncate(req, 8) == 0


def test_rejected_drafts_roll_back_and_are_never_cached() -> None:
    kv = _kv()
    scheduler = _scheduler(kv)
    req = _request("a", [1, 2, 3, 4, 5, 6, 7], 20)
    scheduler.add_request(req)
    out = scheduler.schedule()  # the prompt
    scheduler.update_from_output(out, {"a": 8})
    out = scheduler.schedule()
    (s,) = out.scheduled
    assert (s.num_tokens, s.num_spec_slots) == (1, K)
    assert len(s.block_ids) == kv.blocks_for(req.num_tokens + K)
    # Three drafts, the first accepted: tokens 9 (accepted) then 10 (the correction).
    update = scheduler.update_from_output(out, {"a": 10}, {"a": VerifiedDraft(3, (9,))})
    assert [a.token_id for a in update.appended] == [9, 10]
    assert req.output_token_ids == [8, 9, 10]
    assert req.num_computed_tokens == req.num_tokens - 1 == 9
    assert len(kv.blocks("a")) == kv.blocks_for(req.num_tokens)
    cached = [b for b in kv.blocks("a") if b.block_hash is not None]
    assert [b.block_hash for b in cached] == kv.lookup.hashes(req)[: len(cached)]
    assert (req.spec.num_drafted, req.spec.num_accepted, req.spec.num_emitted) == (3, 1, 2)


def test_a_short_pool_drops_draft_slots_before_it_preempts_anyone() -> None:
    kv = _kv(num_blocks=4)  # 3 usable blocks
    scheduler = _scheduler(kv)
    a = _request("a", [1, 2, 3], 20)  # its next token fits its block; its draft slots need another
    b = _request("b", [5, 6, 7, 8], 20)  # its next token needs a new block
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()  # both prompts: one block each
    scheduler.update_from_output(out, {"a": 4, "b": 9})
    assert kv.num_free_blocks == 1
    out = scheduler.schedule()  # a's drafts would take the last block b's token needs
    assert not out.preempted_ids and scheduler.num_preemptions == 0
    assert {s.request_id: (s.num_tokens, s.num_spec_slots) for s in out.scheduled} == {
        "a": (1, 0),
        "b": (1, 0),
    }
    assert len(kv.blocks("a")) == 1 and len(kv.blocks("b")) == 2


def test_no_draft_slots_when_one_token_is_left_or_opted_out() -> None:
    kv = _kv()
    scheduler = _scheduler(kv)
    scheduler.add_request(_request("short", [1, 2, 3], 2))
    scheduler.add_request(_request("out", [1, 2, 3], 10, speculative=False))
    scheduler.update_from_output(scheduler.schedule(), {"short": 4, "out": 4})
    slots = {s.request_id: s.num_spec_slots for s in scheduler.schedule().scheduled}
    assert slots == {"short": 0, "out": 0}


class SpecKVMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = _kv()
        self.scheduler = _scheduler(self.kv)
        self.num_added = 0
        self.num_verified = 0

    @rule(
        phrase=st.lists(st.integers(1, 6), min_size=1, max_size=5),
        repeats=st.integers(1, 4),
        max_tokens=st.integers(1, 24),
    )
    def add(self, phrase: list[int], repeats: int, max_tokens: int) -> None:
        if len(self.scheduler.requests) >= 6:
            return
        rid = f"r{self.num_added}"
        self.num_added += 1
        self.scheduler.add_request(_request(rid, phrase * repeats, max_tokens))

    @precondition(lambda self: self.scheduler.has_unfinished())
    @rule(data=st.data(), num_steps=st.integers(1, 6))
    def steps(self, data: st.DataObject, num_steps: int) -> None:
        for _ in range(num_steps):
            self._step(data)
            self.accounting_is_exact()

    def _step(self, data: st.DataObject) -> None:
        out = self.scheduler.schedule()
        live = [s for s in out.scheduled if s.samples]
        if live and data.draw(st.booleans(), "abort mid-verification"):
            victim = data.draw(st.sampled_from(live), "victim")
            self.scheduler.finish_request(victim.request_id, RequestStatus.FINISHED_ABORTED)
        sampled: dict[str, int] = {}
        verified: dict[str, VerifiedDraft] = {}
        for s in live:
            sampled[s.request_id] = data.draw(st.integers(1, 6))
            if s.num_spec_slots:
                num_drafted = data.draw(st.integers(0, s.num_spec_slots))
                num_accepted = data.draw(st.integers(0, num_drafted))
                accepted = tuple(
                    data.draw(st.lists(st.integers(1, 6), min_size=num_accepted, max_size=num_accepted))
                )
                if num_drafted:
                    verified[s.request_id] = VerifiedDraft(num_drafted, accepted)
                    self.num_verified += 1
        self.scheduler.update_from_output(out, sampled, verified)

    @precondition(lambda self: self.scheduler.has_unfinished())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
        self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)

    @invariant()
    def accounting_is_exact(self) -> None:
        kv = self.kv
        held: Counter[int] = Counter()
        for rid, req in self.scheduler.requests.items():
            blocks = kv.blocks(rid)
            held.update(b.block_id for b in blocks)
            if req.status is not RequestStatus.RUNNING:
                assert not blocks, f"{rid} is {req.status} and holds blocks"
                continue
            assert req.num_computed_tokens < req.num_tokens
            assert kv.blocks_for(req.num_computed_tokens) <= len(blocks) <= kv.blocks_for(req.num_tokens)
            hashes = kv.lookup.hashes(req)
            for i, block in enumerate(blocks):
                if block.block_hash is not None:
                    assert i < req.num_computed_tokens // BS, "a block past the computed tokens is cached"
                    assert block.block_hash == hashes[i], "a cached block does not hold the real tokens"
        for block in kv.pool.blocks[1:]:
            assert block.ref_cnt == held[block.block_id]
        assert kv.num_free_blocks == kv.num_total_blocks - len(held)

    def teardown(self) -> None:
        VERIFIED.append(self.num_verified)
        for rid in list(self.scheduler.requests):
            self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        assert self.kv.num_free_blocks == self.kv.num_total_blocks


VERIFIED: list[int] = []  # verify steps per run, to check the machine exercises speculation

TestSpecKVMachine = SpecKVMachine.TestCase
TestSpecKVMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


def test_the_machine_verifies_drafts() -> None:
    # Runs after TestSpecKVMachine in this module (pytest keeps file order).
    if VERIFIED:
        assert sum(1 for n in VERIFIED if n > 0) >= len(VERIFIED) // 6
