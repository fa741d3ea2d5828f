"""Speculative decoding through the whole engine: greedy output is token-identical with it on and
off (and to transformers' generate), across batch mixes, chunked prefill, preemption, the prefix
cache, n > 1, stop strings, logprobs and aborts; the KV pool is whole again after every run."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, SamplingParams
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

OFF = SpeculativeConfig()
# The batch rule off (every step may speculate), so every mix exercises verification.
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, num_speculative_tokens=4, max_verify_tokens=4096)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("spec-tiny"), num_kv_heads=2, max_position_embeddings=512)


def engine_for(
    path: Path,
    spec: SpeculativeConfig,
    *,
    budget: int = 512,
    num_blocks: int = 400,
    block_size: int = 4,
    max_num_seqs: int = 16,
    caching: bool = True,
) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=caching),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=512
            ),
            speculative=spec,
        )
    )


def copy_prompts(num: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a random phrase (the n-gram drafter finds matches), and random ones."""
    rng = random.Random(seed)
    prompts = []
    for i in range(num):
        if i % 3 == 2:
            prompts.append([rng.randrange(3, 300) for _ in range(rng.randrange(1, 60))])
        else:
            phrase = [rng.randrange(3, 300) for _ in range(rng.randrange(3, 9))]
            prompts.append(phrase * rng.randrange(2, 7) + phrase[: rng.randrange(0, len(phrase))])
    return prompts


def run(
    engine: LLMEngine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    arrive_every: int = 0,
    abort: dict[str, int] | None = None,
) -> dict[str, list[RequestOutput]]:
    """Run to completion; prompt i arrives after `i * arrive_every` steps; `abort`: id -> step."""
    outs: dict[str, list[RequestOutput]] = {f"r{i}": [] for i in range(len(prompts))}
    pending = list(enumerate(prompts))
    for step in range(10_000):
        while pending and pending[0][0] * arrive_every <= step:
            i, p = pending.pop(0)
            engine.add_request(EngineRequest(f"r{i}", tuple(p), params))
        for rid, at in (abort or {}).items():
            if at == step:
                for o in engine.abort(rid):
                    outs[o.request_id].append(o)
        if not pending and not engine.has_unfinished():
            break
        for o in engine.step():
            outs[o.request_id].append(o)
    assert not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    assert all(b.ref_cnt == 0 for b in engine.kv.pool.blocks[1:])
    return outs


def tokens(outs: dict[str, list[RequestOutput]]) -> dict[str, list[int]]:
    return {rid: [t for o in os for t in o.new_token_ids] for rid, os in outs.items()}


GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

MIXES = {
    "together": dict(),
    "staggered": dict(arrive_every=3),
    "chunked-prefill": dict(budget=16, arrive_every=1),
    "preemption": dict(num_blocks=40, arrive_every=1),
    "no-prefix-cache": dict(caching=False),
    "block-size-16": dict(block_size=16, arrive_every=2),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_ngram_greedy_identical_to_no_speculation(tiny: Path, mix: str) -> None:
    options = dict(MIXES[mix])
    arrive_every = int(options.pop("arrive_every", 0))
    prompts = copy_prompts(9, seed=len(mix))
    plain = tokens(run(engine_for(tiny, OFF, **options), prompts, GREEDY, arrive_every))
    engine = engine_for(tiny, NGRAM, **options)
    spec = tokens(run(engine, prompts, GREEDY, arrive_every))
    assert spec == plain
    stats = engine.stats()
    assert stats.num_spec_draft_tokens_total > 0, "the workload must exercise speculation"
    assert 0 < stats.num_spec_accepted_tokens_total < stats.num_spec_draft_tokens_total
    assert stats.num_generation_tokens_total == sum(len(t) for t in spec.values())


def test_ngram_greedy_matches_transformers_generate(tiny: Path) -> None:
    from tests.engine.test_llm_engine import _hf_greedy

    prompts = copy_prompts(4, seed=7)
    spec = tokens(run(engine_for(tiny, NGRAM), prompts, GREEDY))
    reference = _hf_greedy(tiny, prompts, GREEDY.max_tokens)
    assert [spec[f"r{i}"] for i in range(len(prompts))] == reference


def test_logprobs_identical_and_counts_reported(tiny: Path) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=3)
    prompts = copy_prompts(4, seed=3)
    plain = run(engine_for(tiny, OFF), prompts, params)
    spec = run(engine_for(tiny, NGRAM), prompts, params)
    for rid in plain:
        a = [lp for o in plain[rid] for lp in o.new_logprobs or ()]
        b = [lp for o in spec[rid] for lp in o.new_logprobs or ()]
        assert [x.token_id for x in a] == [x.token_id for x in b]
        assert [x.top and [t for t, _ in x.top] for x in a] == [x.top and [t for t, _ in x.top] for x in b]
        assert [x.logprob for x in b] == pytest.approx([x.logprob for x in a], abs=1e-4)
    last = [os[-1] for os in spec.values()]
    assert sum(o.num_draft_tokens for o in last) > 0
    assert all(0 <= o.num_accepted_draft_tokens <= o.num_draft_tokens for o in last)
    assert all(o.num_output_tokens == params.max_tokens for o in last)


def test_max_tokens_and_stop_inside_accepted_drafts(tiny: Path) -> None:
    prompts = copy_prompts(6, seed=11)
    full = tokens(run(engine_for(tiny, OFF), prompts, GREEDY))
    # Stop on a token that each answer produces mid-way: with speculation it may sit inside a run
    # of accepted drafts, and the answer must still end exactly there.
    for max_tokens in (1, 2, 5):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        got = tokens(run(engine_for(tiny, NGRAM), prompts, params))
        assert got == {rid: t[:max_tokens] for rid, t in full.items()}
    for i, rid in enumerate(full):
        stop = full[rid][9]
        params = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop,))
        plain = run(engine_for(tiny, OFF), [prompts[i]], params)["r0"]
        spec = run(engine_for(tiny, NGRAM), [prompts[i]], params)["r0"]
        assert tokens({"x": spec}) == tokens({"x": plain})
        assert spec[-1].finish_reason is FinishReason.STOP and spec[-1].stop_reason == stop


def test_stop_strings_cut_the_same_text(tiny: Path) -> None:
    prompts = copy_prompts(6, seed=5)
    plain_engine = engine_for(tiny, OFF)
    full = run(plain_engine, prompts, GREEDY)
    for i, rid in enumerate(full):
        text = "".join(o.new_text for o in full[rid])
        if len(text) < 12:
            continue
        params = SamplingParams(max_tokens=24, temperature=0.0, stop=(text[6:9],))
        plain = run(engine_for(tiny, OFF), [prompts[i]], params)["r0"]
        spec = run(engine_for(tiny, NGRAM), [prompts[i]], params)["r0"]
        assert "".join(o.new_text for o in spec) == "".join(o.new_text for o in plain)
        assert spec[-1].finish_reason is plain[-1].finish_reason


def test_n_greater_than_one_and_aborts(tiny: Path) -> None:
    prompts = copy_prompts(6, seed=2)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, n=3)
    aborts = {"r1": 4, "r4": 9}
    plain = run(engine_for(tiny, OFF), prompts, params, arrive_every=1, abort=aborts)
    spec = run(engine_for(tiny, NGRAM), prompts, params, arrive_every=1, abort=aborts)
    for rid in plain:
        if rid in aborts:
            assert spec[rid][-1].finish_reason is FinishReason.ABORT
            continue
        by_choice = {c: [t for o in spec[rid] if o.index == c for t in o.new_token_ids] for c in range(3)}
        want = {c: [t for o in plain[rid] if o.index == c for t in o.new_token_ids] for c in range(3)}
        assert by_choice == want


def test_opt_out_request_is_never_speculated(tiny: Path) -> None:
    engine = engine_for(tiny, NGRAM)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, speculative=False)
    outs = run(engine, copy_prompts(3), params)
    assert engine.stats().num_spec_draft_tokens_total == 0
    assert all(os[-1].num_draft_tokens == 0 for os in outs.values())


def test_seeded_sampling_reproducible_with_speculation(tiny: Path) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.8, top_k=20, seed=1234, ignore_eos=True)
    prompts = copy_prompts(5, seed=9)
    first = run(engine_for(tiny, NGRAM), prompts, params)
    again = run(engine_for(tiny, NGRAM), prompts, params, arrive_every=2)
    assert tokens(first) == tokens(again)
    assert sum(os[-1].num_draft_tokens for os in first.values()) > 0


def test_large_batches_run_without_speculation(tiny: Path) -> None:
    # 9 decodes x (1 + 4) = 45 verify tokens > 40: while all nine decode, nobody speculates.
    rule = SpeculativeConfig(SpeculativeMethod.NGRAM, num_speculative_tokens=4, max_verify_tokens=40)
    engine = engine_for(tiny, rule)
    prompts = copy_prompts(9, seed=4)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    spec = tokens(run(engine, prompts, params))
    assert spec == tokens(run(engine_for(tiny, OFF), prompts, params))
    assert engine.stats().num_spec_draft_tokens_total == 0
    assert engine.spec_counters.num_steps_off_by_batch > 0
    # Eight decodes fit (8 x 5 = 40): the same workload then speculates.
    engine = engine_for(tiny, rule)
    run(engine, prompts[:8], params)
    assert engine.stats().num_spec_draft_tokens_total > 0
