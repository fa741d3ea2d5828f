"""The prefix cache inside the engine, on a tiny random Llama (GQA) in fp32.

Same tokens with the cache on and off (greedy and seeded), `num_cached_tokens` in the outputs,
no sharing between tenants, shared prefixes shared with what follows kept private, and n=4
sampling forking from one prefill (copy-on-write) while matching four independent requests.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import InvalidRequestError
from weir.engine.kv.block_hash import SHARED_SCOPE
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput, SchedulerOutput
from weir.engine.request import SamplingParams

BS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("prefix"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


def _engine(path: Path, caching: bool = True, num_blocks: int = 300, budget: int = 256) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=BS, num_blocks=num_blocks, enable_prefix_caching=caching),
            scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=512),
        )
    )


def _drain(engine: LLMEngine) -> dict[tuple[str, int], list[RequestOutput]]:
    outs: dict[tuple[str, int], list[RequestOutput]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs.setdefault((o.request_id, o.index), []).append(o)
    assert not engine.has_unfinished()
    return outs


def _tokens(outs: dict[tuple[str, int], list[RequestOutput]]) -> dict[tuple[str, int], list[int]]:
    return {k: [t for o in v for t in o.new_token_ids] for k, v in outs.items()}


def _workload(vocab: int) -> list[list[list[int]]]:
    """Two waves of prompts sharing long prefixes (a system prompt, then per-user histories)."""
    rng = random.Random(3)
    system = [rng.randrange(3, vocab) for _ in range(37)]
    users = [[rng.randrange(3, vocab) for _ in range(n)] for n in (3, 9, 16, 1)]
    first = [system + u for u in users]
    second = [system + u + [rng.randrange(3, vocab) for _ in range(5)] for u in users] + [system]
    return [first, second]


@pytest.mark.parametrize(
    "params", [SamplingParams(max_tokens=8, temperature=0.0), SamplingParams(max_tokens=8, seed=11)]
)
def test_same_tokens_with_the_cache_on_and_off(tiny: Path, params: SamplingParams) -> None:
    results = []
    for caching in (True, False):
        engine = _engine(tiny, caching=caching)
        got: dict[tuple[str, int], list[int]] = {}
        for w, wave in enumerate(_workload(engine.model_config.vocab_size)):
            for i, prompt in enumerate(wave):
                engine.add_request(EngineRequest(f"w{w}-{i}", tuple(prompt), params))
            outs = _drain(engine)
            got.update(_tokens(outs))
            cached = {k: v[-1].num_cached_tokens for k, v in outs.items()}
            if not caching:
                assert not any(cached.values())
            elif w == 1:
                assert all(n >= 36 for n in cached.values()), cached
        assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
        results.append(got)
    assert results[0] == results[1]


def test_tenants_never_hit_each_others_blocks(tiny: Path) -> None:
    engine = _engine(tiny)
    prompt = tuple(range(10, 60))
    params = SamplingParams(max_tokens=2, temperature=0.0)
    for rid, tenant in (("a1", "a"), ("b1", "b"), ("a2", "a")):
        engine.add_request(EngineRequest(rid, prompt, params, tenant_id=tenant, cache_scope=tenant))
        outs = _drain(engine)
        cached = outs[(rid, 0)][-1].num_cached_tokens
        assert cached == (48 if rid == "a2" else 0)
    stats = {t.tenant_id: t for t in engine.prefix_cache.stats().tenants}
    assert stats["a"].num_hit_tokens == 48 and stats["b"].num_hit_tokens == 0
    assert stats["a"].num_queries == 2 and stats["b"].num_queried_tokens == 50


def test_the_shared_scope_cannot_be_named_by_a_request(tiny: Path) -> None:
    engine = _engine(tiny)
    with pytest.raises(InvalidRequestError):
        engine.add_request(EngineRequest("x", (5, 6), SamplingParams(), cache_scope=SHARED_SCOPE))


def test_a_registered_shared_prefix_is_shared_and_the_rest_stays_private(tiny: Path) -> None:
    engine = _engine(tiny)
    admin = engine.prefix_cache
    system = tuple(range(100, 124))  # 6 full blocks
    info = admin.register(system, "sys", pin=True)
    warm = admin.warmup_request(info.prefix_id)
    assert warm is not None
    engine.add_request(warm)
    _drain(engine)
    assert admin.get(info.prefix_id).num_cached_blocks == 6 and admin.warmup_request(info.prefix_id) is None
    params = SamplingParams(max_tokens=2, temperature=0.0)
    question = tuple(range(200, 216))
    engine.add_request(EngineRequest("a", system + question, params, tenant_id="a", cache_scope="a"))
    assert _drain(engine)[("a", 0)][-1].num_cached_tokens == 24
    engine.add_request(EngineRequest("b", system + question, params, tenant_id="b", cache_scope="b"))
    assert _drain(engine)[("b", 0)][-1].num_cached_tokens == 24  # not a's 12 question tokens
    engine.add_request(EngineRequest("a2", system + question, params, tenant_id="a", cache_scope="a"))
    assert _drain(engine)[("a2", 0)][-1].num_cached_tokens == 36
    stats = admin.stats()
    assert stats.num_pinned_blocks == 6
    assert {s.cache_scope: s.num_cached_blocks for s in stats.scopes}[SHARED_SCOPE] == 6
    # Flushing tenant a forgets its continuation, not the pinned shared prefix.
    assert admin.flush(tenant_id="a").num_blocks_flushed >= 4
    engine.add_request(EngineRequest("a3", system + question, params, tenant_id="a", cache_scope="a"))
    assert _drain(engine)[("a3", 0)][-1].num_cached_tokens == 24
    assert admin.flush(model_version="other").model_version_matched is False


def test_n4_forks_share_the_prompt_blocks_and_match_four_seeded_requests(tiny: Path) -> None:
    engine = _engine(tiny)
    steps: list[SchedulerOutput] = []
    execute = engine.runner.execute

    def recording(out: SchedulerOutput, requests, drafts=None):  # type: ignore[no-untyped-def]
        steps.append(out)
        return execute(out, requests, drafts)

    engine.runner.execute = recording  # type: ignore[method-assign]
    prompt = tuple(range(30, 57))  # 27 tokens: 6 full blocks + 3 in a partial block
    engine.add_request(
        EngineRequest("multi", prompt, SamplingParams(max_tokens=6, seed=5, n=4, ignore_eos=True))
    )
    first = engine.step()  # the first choice computes the prompt; the others fork from it
    tables = [list(engine.kv.blocks(f"multi#{i}")) for i in range(4)]
    assert all(t == tables[0] for t in tables)
    assert len(tables[0]) == 7 and all(b.ref_cnt == 4 for b in tables[0])
    outs = _drain(engine)
    assert steps[0].num_tokens == 27
    assert sorted(s.num_tokens for s in steps[1].scheduled) == [1, 1, 1, 1]
    # Three choices copy the partial block before writing into it; the last one writes in place.
    assert len(steps[1].blocks_to_copy) == 3
    assert {src for src, _ in steps[1].blocks_to_copy} == {tables[0][6].block_id}
    got = _tokens(outs)
    got[("multi", 0)] = list(first[0].new_token_ids) + got[("multi", 0)]
    independent = _engine(tiny, caching=False)
    for i in range(4):
        independent.add_request(
            EngineRequest(f"single{i}", prompt, SamplingParams(max_tokens=6, seed=5 + i, ignore_eos=True))
        )
    singles = _tokens(_drain(independent))
    assert [got[("multi", i)] for i in range(4)] == [singles[(f"single{i}", 0)] for i in range(4)]
    assert len({tuple(t) for t in got.values()}) > 1  # the seeds do differ
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
