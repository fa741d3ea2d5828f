"""Engine core: greedy output is token-identical to transformers' generate, in fp32.

Covers the CPU paths (`CPU_PATHS`: the default with row weights and the hand-fused ops, the
packed linears alone, plain `F.linear` unfused; the row weights' C kernel at every row count),
concurrent prompts of mixed lengths on tiny random Llama / Qwen2 / Qwen3 models (MHA, GQA, MQA, a
rope_scaling case), chunked prefill at several chunk sizes, recompute
preemption, aborts, seeded sampling and n>1.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import load_hf_model, make_tiny_model
from weir.engine import engine_builder
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import ContextLengthError, InvalidRequestError
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import FinishReason, SamplingParams
from weir.kernels import cpu_decode_layers, cpu_small_gemm

PROMPT_LENGTHS = (1, 5, 17, 33, 64, 100, 180, 300)
MAX_TOKENS = 12


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def _engine(
    path: Path,
    budget: int = 512,
    num_blocks: int = 400,
    block_size: int = 16,
    cpu_packed_linear: bool | None = None,
    cpu_row_weights: bool | None = None,
    cpu_wide_step_threads: int | None = None,
    cpu_decode_layers: bool = True,
    **cache,
) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, **cache),
            scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=512),
            cpu_packed_linear=cpu_packed_linear,
            cpu_row_weights=cpu_row_weights,
            cpu_wide_step_threads=cpu_wide_step_threads,
            cpu_decode_layers=cpu_decode_layers,
        )
    )


def _run_all(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", tuple(p), params))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    assert not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    return out


def _hf_greedy(path: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    model = load_hf_model(path)
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


MODELS = {
    "llama-mha": dict(arch="llama"),
    "llama-gqa": dict(arch="llama", num_kv_heads=2),
    "llama-mqa-tied": dict(arch="llama", num_kv_heads=1, tie=True),
    "llama-llama3-rope": dict(
        arch="llama",
        num_kv_heads=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2-bias": dict(arch="qwen2", num_kv_heads=2),
    "qwen3-qknorm": dict(arch="qwen3", num_kv_heads=1),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def tiny(request, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_tiny_model(
        tmp_path_factory.mktemp(request.param), max_position_embeddings=512, **MODELS[request.param]
    )


# The CPU paths: the default (packed linears, row weights for batch-1 steps, hand-fused small
# ops), the packed linears alone, and plain F.linear with the small ops as they were before.
CPU_PATHS = {
    "default": ({}, True),
    "packed-no-row-weights": ({"cpu_row_weights": False}, True),
    "plain-unfused": ({"cpu_packed_linear": False}, False),
}


@pytest.mark.parametrize(("row_weights", "rows"), [(True, 1), (False, 0)])
def test_the_stats_report_the_row_inputs_the_linears_were_built_with(
    tiny: Path, row_weights: bool, rows: int
) -> None:
    engine = _engine(tiny, cpu_row_weights=row_weights)
    assert engine.stats().cpu_row_inputs == rows


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
def test_greedy_matches_transformers_generate(tiny: Path, path: str) -> None:
    options, fused_ops = CPU_PATHS[path]
    engine = _engine(tiny, **options)
    engine.runner.model.fused_ops = fused_ops
    prompts = _prompts(engine.model_config.vocab_size)
    ours = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    ref = _hf_greedy(tiny, prompts, MAX_TOKENS)
    for i in range(len(prompts)):
        assert ours[f"r{i}"] == ref[i], f"prompt {i} (len {len(prompts[i])})"
    # one sequence alone: every decode step is a one-row step (the row weights' path)
    alone = _run_all(engine, [prompts[3]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    assert alone["r0"] == ref[3]


def _row_weights_at_every_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build engines whose row copies serve every decode step up to the C kernel's 8 rows, as
    `auto` does on hosts where its panels win at every row count (skips without the kernel)."""
    if not cpu_small_gemm.available():
        pytest.skip("no C compiler here")
    monkeypatch.setattr(engine_builder, "row_weight_inputs", lambda config: cpu_small_gemm.MAX_ROWS)


@pytest.mark.parametrize("decode_layers", [True, False], ids=["layers-in-one-call", "layer-by-layer"])
def test_row_weights_at_every_row_count_keep_greedy_identical(
    tiny: Path, monkeypatch: pytest.MonkeyPatch, decode_layers: bool
) -> None:
    _row_weights_at_every_row_count(monkeypatch)
    engine = _engine(tiny)
    assert engine.stats().cpu_row_inputs == cpu_small_gemm.MAX_ROWS
    model = engine.runner.model
    native = model.native_decode  # the decode steps' layers in one C call (engine/models/native_decode.py)
    assert (native is not None) == (cpu_decode_layers.available() and not model.config.qk_norm)
    model.native_ops.decode_layers = decode_layers
    prompts = _prompts(engine.model_config.vocab_size, seed=5)  # 8 prompts: decode steps of 1-8 rows
    ours = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    ref = _hf_greedy(tiny, prompts, MAX_TOKENS)
    for i in range(len(prompts)):
        assert ours[f"r{i}"] == ref[i], f"prompt {i} (len {len(prompts[i])})"
    if native is not None:  # every decode step of 1-8 rows took the C driver, or none did
        assert (native.steps_taken > 0) == decode_layers
        assert engine.stats().native_decode_steps == native.steps_taken  # /metrics reads it


def test_decode_steps_of_nine_to_sixteen_rows_keep_greedy_identical(
    llama_gqa: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 sequences at once: decode steps of up to 16 rows, whose linears take the C kernel in two
    groups of 8 over each panel, every layer in one C call."""
    _row_weights_at_every_row_count(monkeypatch)
    engine = _engine(llama_gqa)
    native = engine.runner.model.native_decode
    assert native is not None and native.max_rows == cpu_small_gemm.MAX_ROWS == 16
    prompts = _prompts(engine.model_config.vocab_size, seed=8) + _prompts(
        engine.model_config.vocab_size, seed=9
    )
    ours = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    assert native.steps_taken > 0
    ref = _hf_greedy(llama_gqa, prompts, MAX_TOKENS)
    for i in range(len(prompts)):
        assert ours[f"r{i}"] == ref[i], f"prompt {i} (len {len(prompts[i])})"


def test_the_decode_layers_setting_off_keeps_the_layers_one_by_one(
    llama_gqa: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _row_weights_at_every_row_count(monkeypatch)
    if not cpu_decode_layers.available():
        pytest.skip("no C compiler here")
    engine = _engine(llama_gqa, cpu_decode_layers=False)
    model = engine.runner.model
    assert model.native_decode is not None and model.native_ops_built.decode_layers  # built, not used
    assert not model.native_ops.decode_layers
    prompts = _prompts(engine.model_config.vocab_size)[:2]
    _run_all(engine, prompts, SamplingParams(max_tokens=4, temperature=0.0))
    assert model.native_decode.steps_taken == 0


def test_wide_steps_on_two_threads_keep_greedy_identical_to_transformers(llama_gqa: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the decode steps' count, as `weir serve` sets it on 2 cores
    try:
        engine = _engine(llama_gqa, cpu_wide_step_threads=2)
        assert engine.runner.threads is not None
        prompts = _prompts(engine.model_config.vocab_size, seed=3)
        ours = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        assert engine.runner.threads.num_wide_steps > 0  # wide steps ran on two threads (each size first)
        assert torch.get_num_threads() == 1  # and the last decode steps on one
    finally:
        torch.set_num_threads(before)
    ref = _hf_greedy(llama_gqa, prompts, MAX_TOKENS)
    for i in range(len(prompts)):
        assert ours[f"r{i}"] == ref[i], f"prompt {i} (len {len(prompts[i])})"


@pytest.fixture(scope="module")
def llama_gqa(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_tiny_model(
        tmp_path_factory.mktemp("gqa"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def gqa_reference(llama_gqa: Path) -> dict[str, list[int]]:
    engine = _engine(llama_gqa, budget=4096)
    return _run_all(
        engine,
        _prompts(engine.model_config.vocab_size),
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
    )


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_gives_the_same_tokens(llama_gqa: Path, gqa_reference, chunk: int) -> None:  # type: ignore[no-untyped-def]
    # The budget must cover the running decodes, so chunking is set by long_prefill_threshold.
    engine = build_engine(
        EngineConfig(
            model_path=str(llama_gqa),
            cache=CacheConfig(num_blocks=400),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=64, max_num_seqs=16, max_model_len=512, long_prefill_threshold=chunk
            ),
        )
    )
    prompts = _prompts(engine.model_config.vocab_size)
    assert _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)) == gqa_reference


def test_a_target_step_time_keeps_the_tokens_and_reports_its_budget(llama_gqa: Path, gqa_reference) -> None:  # type: ignore[no-untyped-def]
    # A 2 ms target on a tiny model: the budget follows the measured cost, the chunks change,
    # the tokens must not.
    engine = build_engine(
        EngineConfig(
            model_path=str(llama_gqa),
            cache=CacheConfig(num_blocks=400),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=512, max_num_seqs=16, max_model_len=512, target_step_s=0.002
            ),
        )
    )
    prompts = _prompts(engine.model_config.vocab_size)
    assert _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)) == gqa_reference
    stats = engine.stats().step_budget
    assert stats is not None and stats.target_step_s == 0.002 and 1 <= stats.token_budget <= 512
    assert engine.step_budget.model.num_observed == engine.runner.num_steps  # every step fed back
    assert engine.scheduler.step_budget is engine.step_budget
    engine.reset()
    assert engine.scheduler.step_budget is engine.step_budget  # the fitted cost outlives a reset


def test_steps_and_their_seconds_are_counted_by_kind(tiny: Path) -> None:
    engine = _engine(tiny)
    _run_all(engine, _prompts(engine.model_config.vocab_size), SamplingParams(max_tokens=4, temperature=0.0))
    t = engine.stats().step_times
    assert t.prefill_steps >= 1 and t.decode_steps >= 1  # prompts first, then decodes alone
    assert t.prefill_steps + t.decode_steps == engine.runner.num_steps
    assert t.prefill_seconds > 0 and t.decode_seconds > 0


def test_preemption_gives_the_same_tokens(llama_gqa: Path) -> None:
    # Small blocks and long outputs: decodes outgrow the pool after admission, forcing preemption.
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    big = _engine(llama_gqa, num_blocks=400, block_size=4)
    prompts = _prompts(big.model_config.vocab_size)
    expected = _run_all(big, prompts, params)
    small = _engine(llama_gqa, num_blocks=100, block_size=4, enable_prefix_caching=False)
    assert _run_all(small, prompts, params) == expected
    assert small.scheduler.num_preemptions > 0


def test_abort_mid_prefill_and_mid_decode_frees_every_block(llama_gqa: Path) -> None:
    engine = _engine(llama_gqa, budget=32, enable_prefix_caching=False)
    engine.add_request(
        EngineRequest("dec", (5, 6, 7), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    )
    engine.step()
    engine.add_request(EngineRequest("pre", tuple(range(3, 200)), SamplingParams(max_tokens=4)))
    engine.step()
    assert 0 < engine.scheduler.requests["pre"].num_computed_tokens < 197
    assert engine.scheduler.requests["dec"].num_output_tokens >= 1
    outs = engine.abort("pre") + engine.abort("dec")
    assert all(o.finished and o.finish_reason is FinishReason.ABORT for o in outs)
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    assert not engine.has_unfinished()


def test_seed_reproduces_and_top_k_1_is_greedy(llama_gqa: Path, gqa_reference) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(llama_gqa)
    prompts = _prompts(engine.model_config.vocab_size)
    seeded = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1234)
    a = _run_all(engine, prompts, seeded)
    b = _run_all(_engine(llama_gqa, budget=37), list(reversed(prompts)), seeded)
    assert [a[f"r{i}"] for i in range(8)] == [b[f"r{7 - i}"] for i in range(8)]
    top1 = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_k=1))
    assert top1 == gqa_reference


def test_n_choices_share_the_prompt_and_follow_their_seeds(llama_gqa: Path) -> None:
    engine = _engine(llama_gqa)
    prompt = tuple(range(3, 40))
    engine.add_request(
        EngineRequest("multi", prompt, SamplingParams(max_tokens=6, seed=7, n=3, ignore_eos=True))
    )
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.index].extend(o.new_token_ids)
    for i in range(3):
        engine.add_request(
            EngineRequest(f"single{i}", prompt, SamplingParams(max_tokens=6, seed=7 + i, ignore_eos=True))
        )
    single: dict[str, list[int]] = {f"single{i}": [] for i in range(3)}
    while engine.has_unfinished():
        for o in engine.step():
            single[o.request_id].extend(o.new_token_ids)
    assert [got[i] for i in range(3)] == [single[f"single{i}"] for i in range(3)]


def test_invalid_requests_never_enter_the_queue(llama_gqa: Path) -> None:
    engine = _engine(llama_gqa)
    with pytest.raises(ContextLengthError):
        engine.add_request(EngineRequest("long", tuple([5] * 500), SamplingParams(max_tokens=20)))
    with pytest.raises(InvalidRequestError, match="prompt token ids"):
        engine.add_request(EngineRequest("oob", (10**6,), SamplingParams()))
    with pytest.raises(InvalidRequestError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_real_default_model_greedy_matches_transformers(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the row weights for every decode step of up to 8 rows: `auto` keeps them only on machines
    # where they measure faster, and for as many rows as they do
    _row_weights_at_every_row_count(monkeypatch)
    engine = _engine(smollm2_dir, budget=512, num_blocks=300)
    tok = engine.tokenizer
    questions = [
        "Hi",
        "What is the capital of France?",
        "Write a haiku about rivers.",
        "Explain paged attention in one sentence.",
        "List three prime numbers.",
        "Translate 'good morning' into Spanish.",
        "Why is the sky blue? " * 6,
        "Summarise this: " + "the scheduler runs decode tokens first and then prefill. " * 20,
    ]
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in questions
    ]
    assert min(len(p) for p in prompts) < 40 and max(len(p) for p in prompts) > 250
    ours = _run_all(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    ref = _hf_greedy(smollm2_dir, prompts, MAX_TOKENS)
    for i in range(len(prompts)):
        assert ours[f"r{i}"] == ref[i], f"prompt {i}"
    # each alone: every decode step a one-row step, through the row weights
    assert engine.runner.model.packed_head.row_weight_bytes > 0
    for i in (1, 6):
        alone = _run_all(engine, [prompts[i]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        assert alone["r0"] == ref[i], f"prompt {i} alone"


def test_queue_deadline_aborts_a_waiting_request(llama_gqa: Path) -> None:
    now = [0.0]
    engine = build_engine(
        EngineConfig(
            model_path=str(llama_gqa),
            cache=CacheConfig(num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, max_model_len=512),
        ),
        clock=lambda: now[0],
    )
    long_params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest("busy", (5, 6, 7), long_params, arrival_s=0.0))
    engine.add_request(
        EngineRequest("late", (8, 9), SamplingParams(max_tokens=2), arrival_s=0.0, deadline_s=1.0)
    )
    engine.step()
    now[0] = 2.0
    outs = engine.step()
    late = [o for o in outs if o.request_id == "late"]
    assert late and late[0].finished and late[0].finish_reason is FinishReason.ABORT
    assert late[0].error == "deadline_exceeded" and late[0].num_output_tokens == 0
    assert "late" not in engine.scheduler.requests
