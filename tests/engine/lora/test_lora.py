"""LoRA adapters in the engine: greedy output equals HF `generate` on the PEFT-merged model
(token-identical, fp32), a mixed batch of the base model and several adapters gives each request
its solo output (with enough slots, and with fewer slots than adapters), the prefix cache never
hits across adapters, preemption by swap and recompute and speculative decoding keep the
adapter, slots are loaded and evicted LRU, adapters in use cannot be unloaded. SmolLM2 (slow).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from tests.engine.lora_adapters import hf_greedy, make_adapter, merged_model
from tests.engine.tiny_models import load_hf_model, make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, LoraConfig, PreemptionMode, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import InvalidRequestError
from weir.engine.llm_engine import LLMEngine
from weir.engine.lora.lora_types import AdapterInUseError, UnknownAdapterError
from weir.engine.request import SamplingParams

MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
GREEDY_LONG = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
ADAPTERS = {  # name -> make_adapter arguments
    "a": dict(rank=8, seed=1),
    "b": dict(rank=4, seed=2, targets=("q_proj", "v_proj")),
    "c": dict(rank=16, seed=3, targets=("o_proj", "gate_proj", "down_proj"), use_rslora=True),
    "d": dict(rank=2, seed=4, targets=("k_proj", "up_proj")),
}


def _prompts(vocab: int, seed: int = 0, lengths: tuple[int, ...] = (1, 5, 17, 40, 70)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module", params=["llama-gqa", "qwen2-bias-tied"])
def setup(request, tmp_path_factory) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """(base model, adapter directory holding adapters a, b, c, d)."""
    kwargs = (
        dict(arch="llama", num_kv_heads=2)
        if request.param == "llama-gqa"
        else dict(arch="qwen2", num_kv_heads=2, tie=True)
    )
    base = make_tiny_model(tmp_path_factory.mktemp(request.param), max_position_embeddings=512, **kwargs)
    adapter_dir = tmp_path_factory.mktemp("adapters")
    for name, args in ADAPTERS.items():
        make_adapter(base, adapter_dir / name, **args)  # type: ignore[arg-type]
    return base, adapter_dir


def _engine(
    base: Path,
    adapter_dir: Path,
    num_slots: int = 4,
    num_blocks: int = 400,
    host: int = 0,
    mode: PreemptionMode = PreemptionMode.AUTO,
    block_size: int = 16,
    budget: int = 512,
) -> LLMEngine:
    engine = build_engine(
        EngineConfig(
            model_path=str(base),
            cache=CacheConfig(
                block_size=block_size, num_blocks=num_blocks, host_num_blocks=host, preemption_mode=mode
            ),
            scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=512),
            lora=LoraConfig(num_slots=num_slots, max_rank=16, adapter_dir=str(adapter_dir)),
        )
    )
    for name in ADAPTERS:
        engine.adapter_admin.load_adapter(name, name)
    return engine


def _run(
    engine: LLMEngine, jobs: list[tuple[list[int], str | None]], params: SamplingParams = GREEDY
) -> list[list[int]]:
    for i, (prompt, adapter) in enumerate(jobs):
        engine.add_request(EngineRequest(f"r{i}", tuple(prompt), params, adapter_name=adapter))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(jobs))}
    for _ in range(20_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            assert o.error is None, o.error
            out[o.request_id].extend(o.new_token_ids)
    assert not engine.has_unfinished()
    pool = engine.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks
    return [out[f"r{i}"] for i in range(len(jobs))]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_greedy_through_an_adapter_matches_generate_on_the_merged_model(setup, name: str) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    engine = _engine(base, adapter_dir)
    prompts = _prompts(engine.model_config.vocab_size)
    ours = _run(engine, [(p, name) for p in prompts])
    reference = hf_greedy(merged_model(base, adapter_dir / name), prompts, MAX_TOKENS)
    assert ours == reference
    # The adapter changes the output: the comparison is not base against base.
    assert reference != hf_greedy(load_hf_model(base), prompts, MAX_TOKENS)


def test_a_mixed_batch_gives_each_request_its_solo_output(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    prompts = _prompts(320, seed=7, lengths=(3, 9, 20, 33, 50, 64, 7, 15))
    names: list[str | None] = [None, "a", "b", "c", None, "a", "b", "c"]
    jobs = list(zip(prompts, names, strict=True))
    solo = []
    for job in jobs:
        solo.extend(_run(_engine(base, adapter_dir), [job], GREEDY_LONG))
    mixed = _engine(base, adapter_dir)
    assert _run(mixed, jobs, GREEDY_LONG) == solo
    # Fewer slots than adapters in the step: the runner splits the step, the tokens stay.
    few = _engine(base, adapter_dir, num_slots=2)
    assert _run(few, jobs + [(prompts[0], "d")], GREEDY_LONG)[: len(jobs)] == solo
    # And the base model's requests are the base model's: as an engine without LoRA.
    plain = build_engine(replace(mixed.config, lora=LoraConfig()))
    base_jobs = [j for j in jobs if j[1] is None]
    assert _run(plain, base_jobs, GREEDY_LONG) == [s for s, j in zip(solo, jobs, strict=True) if j[1] is None]


def test_slots_are_loaded_and_evicted_least_recently_used(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    prompt = _prompts(320, seed=3, lengths=(12,))[0]
    reference = {n: _run(_engine(base, adapter_dir), [(prompt, n)])[0] for n in ("a", "b", "c")}
    engine = _engine(base, adapter_dir, num_slots=2)
    for name in ("a", "b", "a", "c", "b", "a"):  # c evicts b (a was used later); b then evicts a...
        assert _run(engine, [(prompt, name)]) == [reference[name]]
    info = {i.name: i for i in engine.adapter_admin.adapters()}
    assert (info["a"].num_slot_loads, info["b"].num_slot_loads, info["c"].num_slot_loads) == (2, 2, 1)
    assert (info["a"].num_slot_evictions, info["b"].num_slot_evictions, info["c"].num_slot_evictions) == (
        1,
        1,
        1,
    )
    assert info["a"].slot is not None and info["b"].slot is not None and info["c"].slot is None
    assert info["a"].num_requests == 3 and info["a"].num_tokens > 0


def test_the_prefix_cache_never_hits_across_adapters(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    engine = _engine(base, adapter_dir, block_size=4)
    prompt = _prompts(320, seed=11, lengths=(40,))[0]
    reference = {
        n: _run(_engine(base, adapter_dir, block_size=4), [(prompt, n)])[0] for n in (None, "a", "b")
    }
    for i, name in enumerate((None, "a", "b")):
        before = engine.kv.lookup.totals.hit_tokens
        assert _run(engine, [(prompt, name)]) == [reference[name]]
        assert engine.kv.lookup.totals.hit_tokens == before, (
            f"request {i} ({name}) hit another adapter's blocks"
        )
    for name in (None, "a", "b"):  # the same adapter again: its own blocks are found
        before = engine.kv.lookup.totals.hit_tokens
        assert _run(engine, [(prompt, name)]) == [reference[name]]
        assert engine.kv.lookup.totals.hit_tokens > before
    # The same name with other weights is another cache key: nothing is found.
    make_adapter(base, adapter_dir / "a2", rank=8, seed=99)
    engine.adapter_admin.unload_adapter("a")
    engine.adapter_admin.load_adapter("a", "a2")
    before = engine.kv.lookup.totals.hit_tokens
    _run(engine, [(prompt, "a")])
    assert engine.kv.lookup.totals.hit_tokens == before


def test_shared_prefixes_are_not_used_through_an_adapter(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    engine = _engine(base, adapter_dir, block_size=4)
    prompt = _prompts(320, seed=12, lengths=(30,))[0]
    reference = _run(_engine(base, adapter_dir, block_size=4), [(prompt, "a")])
    engine.kv.shared_prefixes.register(prompt[:16], "system", False)
    _run(engine, [(prompt, None)])  # computes the shared blocks through the base model
    before = engine.kv.lookup.totals.hit_tokens
    assert _run(engine, [(prompt, "a")]) == reference
    assert engine.kv.lookup.totals.hit_tokens == before


@pytest.mark.parametrize("mode", [PreemptionMode.SWAP, PreemptionMode.RECOMPUTE])
def test_preemption_keeps_the_adapter(setup, mode: PreemptionMode) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    prompts = _prompts(320, seed=5, lengths=(30, 25, 38, 12, 33, 20, 27, 9))
    names: list[str | None] = ["a", "b", None, "c", "a", "d", "b", None]
    jobs = list(zip(prompts, names, strict=True))
    reference = _run(_engine(base, adapter_dir, block_size=4), jobs, GREEDY_LONG)
    tight = _engine(base, adapter_dir, num_blocks=30, host=200, mode=mode, block_size=4, budget=64)
    assert _run(tight, jobs, GREEDY_LONG) == reference
    stats = tight.stats()
    assert stats.num_preemptions > 0
    if mode is PreemptionMode.SWAP:
        assert stats.host_kv is not None and stats.host_kv.num_swap_preemptions > 0


def test_speculative_decoding_through_adapters_gives_the_same_tokens(setup) -> None:  # type: ignore[no-untyped-def]
    from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

    base, adapter_dir = setup
    prompts = [p * 3 for p in _prompts(320, seed=8, lengths=(5, 9, 14, 6))]  # repeats: n-gram drafts
    jobs = list(zip(prompts, ["a", None, "b", "c"], strict=True))
    reference = _run(_engine(base, adapter_dir), jobs, GREEDY_LONG)
    plain = _engine(base, adapter_dir)
    speculating = build_engine(
        replace(
            plain.config, speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM, max_verify_tokens=64)
        )
    )
    for name in ADAPTERS:
        speculating.adapter_admin.load_adapter(name, name)
    assert _run(speculating, jobs, GREEDY_LONG) == reference
    assert speculating.stats().num_spec_draft_tokens_total > 0


def test_unknown_adapters_are_refused_and_adapters_in_use_stay(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    engine = _engine(base, adapter_dir)
    with pytest.raises(UnknownAdapterError) as err:
        engine.add_request(EngineRequest("x", (5, 6, 7), GREEDY, adapter_name="nope"))
    assert isinstance(err.value, InvalidRequestError) and err.value.param == "model"
    engine.add_request(EngineRequest("y", (5, 6, 7), GREEDY, adapter_name="a"))
    with pytest.raises(AdapterInUseError):
        engine.adapter_admin.unload_adapter("a")
    with pytest.raises(AdapterInUseError):
        engine.adapter_admin.load_adapter("a", "b")
    while engine.has_unfinished():
        engine.step()
    assert engine.adapter_admin.unload_adapter("a").name == "a"
    assert {i.name for i in engine.adapter_admin.adapters()} == {"b", "c", "d"}
    with pytest.raises(UnknownAdapterError):
        engine.add_request(EngineRequest("z", (5, 6, 7), GREEDY, adapter_name="a"))
    plain = build_engine(replace(engine.config, lora=LoraConfig()))
    with pytest.raises(UnknownAdapterError):
        plain.add_request(EngineRequest("w", (5, 6, 7), GREEDY, adapter_name="a"))


@pytest.mark.slow
def test_real_default_model_through_an_adapter_matches_the_merged_model(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    adapter_dir = tmp_path / "adapters"
    make_adapter(smollm2_dir, adapter_dir / "tuned", rank=16, alpha=32, seed=0, b_std=0.02)
    engine = build_engine(
        EngineConfig(
            model_path=str(smollm2_dir),
            cache=CacheConfig(block_size=16, num_blocks=300),
            scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=512),
            lora=LoraConfig(num_slots=2, max_rank=16, adapter_dir=str(adapter_dir)),
        )
    )
    engine.adapter_admin.load_adapter("tuned", "tuned")
    tok = engine.tokenizer
    questions = [
        "Hi",
        "What is the capital of France?",
        "Write a haiku about rivers.",
        "List three prime numbers.",
    ]
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in questions
    ]
    jobs: list[tuple[list[int], str | None]] = [(p, "tuned") for p in prompts] + [(prompts[1], None)]
    ours = _run(engine, jobs)
    reference = hf_greedy(merged_model(smollm2_dir, adapter_dir / "tuned"), prompts, MAX_TOKENS)
    assert ours[: len(prompts)] == reference
    assert ours[len(prompts)] == hf_greedy(load_hf_model(smollm2_dir), [prompts[1]], MAX_TOKENS)[0]
    assert reference != hf_greedy(load_hf_model(smollm2_dir), prompts, MAX_TOKENS)


def test_load_and_unload_under_streaming_load_fail_and_truncate_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from weir.engine.async_engine import AsyncEngine

    base, adapter_dir = setup
    prompts = _prompts(320, seed=21, lengths=(6, 11, 19, 25, 8, 14))
    names: list[str | None] = ["a", "b", None, "a", "c", "b"]
    reference = _run(_engine(base, adapter_dir), list(zip(prompts, names, strict=True)), GREEDY_LONG)
    core = _engine(base, adapter_dir)

    async def main() -> None:
        engine = AsyncEngine(core=core)
        await engine.start(warmup=False)

        async def stream(i: int) -> list[int]:
            er = EngineRequest(f"s{i}", tuple(prompts[i]), GREEDY_LONG, adapter_name=names[i])
            return [t async for out in engine.generate(er) for t in out.new_token_ids]

        try:
            tasks = [asyncio.create_task(stream(i)) for i in range(len(prompts))]
            await asyncio.sleep(0)
            # While they stream: load a new adapter, unload an unused one, try an used one.
            assert (await engine.load_adapter("a-copy", "a")).fingerprint == core.runner.lora.info(
                "a"
            ).fingerprint  # type: ignore[union-attr]
            await engine.unload_adapter("d")
            try:  # refused while a stream through it is queued or running (they may be done)
                await engine.unload_adapter("a")
                await engine.load_adapter("a", "a")
            except AdapterInUseError:
                pass
            results = await asyncio.gather(*tasks)
            assert results == reference
            assert all(len(r) == GREEDY_LONG.max_tokens for r in results)
            # The copy serves as the original does.
            er = EngineRequest("copy", tuple(prompts[0]), GREEDY_LONG, adapter_name="a-copy")
            assert [t async for out in engine.generate(er) for t in out.new_token_ids] == reference[0]
            await engine.unload_adapter("a")  # unused now
            assert {i.name for i in await engine.adapters()} == {"a-copy", "b", "c"}
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_the_memory_footprint_counts_exactly_the_slots_the_model_allocates(setup) -> None:  # type: ignore[no-untyped-def]
    base, adapter_dir = setup
    engine = _engine(base, adapter_dir, num_slots=3)
    lora = engine.runner.lora
    assert lora is not None
    itemsize = 4  # float32
    assert lora.slot_bytes == engine.model_config.lora_slot_params(3, 16) * itemsize
