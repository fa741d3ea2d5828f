"""Preemption by swap or recompute and the host tier of the prefix cache, inside the engine.

On a tiny random Llama (GQA) in fp32: the same tokens, greedy and seeded, with forced swapping
(a tiny device pool), forced recompute and neither; greedy tokens as transformers' generate with
swapping; the same tokens when swapping under speculative decoding; a prefix demoted to the host
and hit again is promoted and gives the same tokens, and never for another tenant; a swapped
request that streamed tokens is never expired as queued; a failed step's swaps are discarded.
One test runs SmolLM2 (slow).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.engine.sim import Sim, next_token, reference_output
from tests.engine.test_llm_engine import _hf_greedy
from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, PreemptionMode, QueuePolicy, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import Priority, RequestStatus, SamplingParams

BS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("swap"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


def _engine(
    path: Path,
    num_blocks: int,
    host: int = 0,
    mode: PreemptionMode = PreemptionMode.AUTO,
    caching: bool = True,
) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(
                block_size=BS,
                num_blocks=num_blocks,
                host_num_blocks=host,
                preemption_mode=mode,
                enable_prefix_caching=caching,
            ),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
        )
    )


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(3, 40))] for _ in range(8)]


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list[int]]:
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(EngineRequest(f"r{i}", tuple(p), sp))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(20_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            assert o.error is None, o.error
            out[o.request_id].extend(o.new_token_ids)
    assert not engine.has_unfinished()
    _assert_nothing_leaked(engine)
    return out


def _assert_nothing_leaked(engine: LLMEngine) -> None:
    pool = engine.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks - pool.num_pinned_blocks
    host = engine.kv.host
    if host is not None:
        assert host.pool.num_free_blocks == host.pool.num_usable_blocks and not host.records


GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _seeded(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=100 + i, ignore_eos=True)


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_same_tokens_when_swapping_when_recomputing_and_unconstrained(tiny: Path, sampling: str) -> None:
    plain = _engine(tiny, num_blocks=400)
    prompts = _prompts(plain.model_config.vocab_size)
    params = [GREEDY if sampling == "greedy" else _seeded(i) for i in range(len(prompts))]
    reference = _run(plain, prompts, params)
    assert plain.stats().num_preemptions == 0

    swapping = _engine(tiny, num_blocks=30, host=200, mode=PreemptionMode.SWAP)
    assert _run(swapping, prompts, params) == reference
    host = swapping.stats().host_kv
    assert host is not None and host.num_swap_preemptions > 0 and host.num_blocks_swapped_in > 0

    recomputing = _engine(tiny, num_blocks=30, host=200, mode=PreemptionMode.RECOMPUTE)
    assert _run(recomputing, prompts, params) == reference
    stats = recomputing.stats()
    assert stats.num_preemptions > 0 and stats.host_kv is not None and stats.host_kv.num_swap_preemptions == 0


def test_swapping_without_prefix_caching_copies_every_block_and_gives_the_same_tokens(tiny: Path) -> None:
    plain = _engine(tiny, num_blocks=400, caching=False)
    prompts = _prompts(plain.model_config.vocab_size)
    reference = _run(plain, prompts, [GREEDY] * len(prompts))
    swapping = _engine(tiny, num_blocks=30, host=200, mode=PreemptionMode.SWAP, caching=False)
    assert _run(swapping, prompts, [GREEDY] * len(prompts)) == reference
    host = swapping.stats().host_kv
    assert host is not None and host.num_blocks_swapped_in == host.num_blocks_swapped_out > 0


def test_greedy_with_swapping_matches_transformers_generate(tiny: Path) -> None:
    engine = _engine(tiny, num_blocks=30, host=200, mode=PreemptionMode.AUTO)
    prompts = _prompts(engine.model_config.vocab_size)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    ours = _run(engine, prompts, [params] * len(prompts))
    host = engine.stats().host_kv
    assert host is not None and host.num_swap_preemptions > 0 and host.copy_bytes_per_s > 0
    reference = _hf_greedy(tiny, prompts, 24)
    for i in range(len(prompts)):
        assert ours[f"r{i}"][: len(reference[i])] == reference[i], f"prompt {i}"


def test_swapping_with_speculative_decoding_gives_the_same_tokens(tiny: Path) -> None:
    from dataclasses import replace

    from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

    plain = _engine(tiny, num_blocks=400)
    prompts = [p * 3 for p in _prompts(plain.model_config.vocab_size)]  # repeats: the n-gram drafter proposes
    reference = _run(plain, prompts, [GREEDY] * len(prompts))
    base = _engine(tiny, num_blocks=60, host=300, mode=PreemptionMode.SWAP).config
    config = replace(base, speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM))
    speculating = build_engine(config)
    assert _run(speculating, prompts, [GREEDY] * len(prompts)) == reference
    stats = speculating.stats()
    assert stats.host_kv is not None and stats.host_kv.num_swap_preemptions > 0
    assert stats.num_spec_draft_tokens_total > 0  # drafts were verified between the swaps


def _one(engine: LLMEngine, rid: str, prompt: list[int], tenant: str) -> tuple[list[int], int]:
    engine.add_request(EngineRequest(rid, tuple(prompt), GREEDY, tenant_id=tenant, cache_scope=tenant))
    tokens: list[int] = []
    cached = 0
    while engine.has_unfinished():
        for o in engine.step():
            tokens.extend(o.new_token_ids)
            if o.finished:
                cached = o.num_cached_tokens
    return tokens, cached


def test_a_demoted_prefix_is_promoted_on_a_hit_with_the_same_tokens_and_only_for_its_tenant(
    tiny: Path,
) -> None:
    engine = _engine(tiny, num_blocks=20, host=100)  # 19 device blocks: one request at a time
    vocab = engine.model_config.vocab_size
    rng = random.Random(9)
    history = [rng.randrange(3, vocab) for _ in range(40)]
    first, cached = _one(engine, "a1", history, "a")
    assert cached == 0
    for i in range(3):  # other traffic evicts the history's blocks from the device: demoted
        _one(engine, f"x{i}", [rng.randrange(3, vocab) for _ in range(40)], "x")
    host = engine.kv.host
    assert host is not None and host.num_demotions > 0
    promotions = host.num_promotions
    again, cached = _one(engine, "a2", history, "a")
    assert again == first
    assert cached == 36 and host.num_promotions > promotions  # 9 full blocks, the last token computed
    promotions = host.num_promotions
    other, cached = _one(engine, "b1", history, "b")  # same tokens, another tenant: no hit, no promotion
    assert cached == 0 and host.num_promotions == promotions and other == first
    _assert_nothing_leaked(engine)


def test_a_swapped_request_that_streamed_tokens_is_never_expired_as_queued() -> None:
    sim = Sim(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=QueuePolicy.PRIORITY),
        num_blocks=10,
        host_num_blocks=32,
    )
    early = sim.add("early", list(range(1, 12)), 12, priority=Priority.BATCH)
    early.deadline_s = 0.05
    sim.sched._num_deadlines += 1  # as add_request counts a deadline given at construction
    sim.step()
    sim.step()
    assert early.num_output_tokens > 0
    for i in range(3):  # interactive arrivals displace the batch request: it is swapped out
        sim.add(f"late{i}", list(range(20 + 12 * i, 31 + 12 * i)), 12, priority=Priority.INTERACTIVE)
    swapped_past_deadline = False
    for _ in range(500):
        if not sim.sched.has_unfinished():
            break
        assert early not in sim.sched.expire_deadlines()
        sim.step()
        if early.status is RequestStatus.SWAPPED and sim.clock.now > early.deadline_s:
            swapped_past_deadline = True
    assert swapped_past_deadline
    assert sim.outputs["early"] == reference_output(list(range(1, 12)), 12)


def test_a_waiting_request_never_scheduled_still_expires() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1), num_blocks=16, host_num_blocks=32)
    sim.add("runs", list(range(1, 6)), 30)
    late = sim.add("waits", list(range(7, 12)), 4)
    late.deadline_s = 0.02
    sim.sched._num_deadlines += 1
    for _ in range(5):
        sim.step()
    assert [r.request_id for r in sim.sched.expire_deadlines()] == ["waits"]


def test_a_failed_steps_swaps_are_discarded_and_its_victims_recompute() -> None:
    sim = Sim(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=QueuePolicy.FCFS),
        num_blocks=10,
        host_num_blocks=32,
    )
    prompts = {f"r{i}": list(range(10 * i + 1, 10 * i + 12)) for i in range(4)}
    for rid, p in prompts.items():
        sim.add(rid, p, 10)
    discarded = 0
    for _ in range(500):
        if not sim.sched.has_unfinished():
            break
        out = sim.sched.schedule()
        if not out.swaps.is_empty and discarded < 3:
            # The runner failed before its copies: nothing of this step ran.
            for s in out.scheduled:
                req = sim.sched.requests[s.request_id]
                if req.status is RequestStatus.RUNNING:
                    sim.sched.preemption.requeue(req)
            sim.sched.preemption.discard_swaps(out, sim.sched.requests)
            discarded += 1
            assert not any(
                r.status is RequestStatus.SWAPPED
                for r in sim.sched.requests.values()
                if r.request_id in out.preempted_ids
            )
            continue
        sampled = {
            s.request_id: next_token(sim.sched.requests[s.request_id].all_token_ids)
            for s in out.scheduled
            if s.samples
        }
        for appended in sim.sched.update_from_output(out, sampled).appended:
            sim.outputs[appended.request.request_id].append(appended.token_id)
        sim.clock.now += 0.01
    assert discarded > 0 and not sim.sched.has_unfinished()
    for rid, p in prompts.items():
        assert sim.outputs[rid] == reference_output(p, 10)
    host = sim.kv.host
    assert host is not None and not host.records and host.pool.num_free_blocks == host.pool.num_usable_blocks


@pytest.mark.slow
def test_smollm2_gives_the_same_tokens_when_swapping(smollm2_dir: Path) -> None:
    def engine(num_blocks: int, host: int) -> LLMEngine:
        return build_engine(
            EngineConfig(
                model_path=str(smollm2_dir),
                cache=CacheConfig(
                    block_size=16,
                    num_blocks=num_blocks,
                    host_num_blocks=host,
                    preemption_mode=PreemptionMode.SWAP,
                ),
                scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=512),
            )
        )

    rng = random.Random(2)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (30, 70, 50, 90)]
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * 2 + [
        _seeded(i) for i in range(2)
    ]
    reference = _run(engine(200, 0), prompts, params)
    swapping = engine(14, 64)  # 13 blocks of 16: the four cannot all stay
    assert _run(swapping, prompts, params) == reference
    host = swapping.stats().host_kv
    assert host is not None and host.num_swap_preemptions > 0
