"""Loader: HF config translation (old and new RoPE formats) and clear errors for bad folders."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.tiny_models import make_tiny_model
from weir.engine.config import RopeScalingType
from weir.engine.kv.kv_tensors import allocate_kv_caches, kv_cache_shape, num_blocks_for
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.runner.loader import ModelLoadError, load_model, load_model_config, model_config_from_hf

CPU = torch.device("cpu")


def _old_style(**overrides: Any) -> SimpleNamespace:
    """A transformers-4 style config object: rope_theta and rope_scaling at the top level."""
    fields: dict[str, Any] = dict(
        model_type="llama",
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        rope_theta=500000.0,
        rope_scaling=None,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=False,
        hidden_act="silu",
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def _edit_config(path: Path, **changes: Any) -> None:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), num_kv_heads=2)


# ---- config translation ------------------------------------------------------------------


def test_old_style_rope_fields_and_head_dim_default() -> None:
    config = model_config_from_hf(_old_style(rope_scaling={"type": "linear", "factor": 4.0}))
    assert config.rope.theta == 500000.0
    assert config.rope.scaling_type is RopeScalingType.LINEAR
    assert config.rope.factor == 4.0
    assert config.head_dim == 16
    assert config.max_model_len == 512
    assert config.eos_token_ids == (2,)
    assert config.bos_token_id == 1


def test_llama3_and_yarn_defaults_follow_hf() -> None:
    llama3 = model_config_from_hf(
        _old_style(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            }
        )
    )
    assert llama3.rope.original_max_position_embeddings == 512  # falls back to max positions
    yarn = model_config_from_hf(
        _old_style(
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "original_max_position_embeddings": 128}
        )
    )
    assert yarn.rope.factor == 4.0  # max_position_embeddings / original when factor is absent
    assert yarn.rope.theta == 1e6


def test_eos_ids_merge_generation_config_and_flags_per_arch() -> None:
    config = model_config_from_hf(
        _old_style(model_type="qwen2", eos_token_id=[5, 6], sliding_window=64, use_sliding_window=False),
        {"eos_token_id": [6, 7], "bos_token_id": 3},
    )
    assert config.eos_token_ids == (5, 6, 7)
    assert config.attention_bias  # Qwen2 always has q/k/v biases
    assert not config.qk_norm
    assert config.sliding_window is None
    assert model_config_from_hf(_old_style(model_type="qwen3", head_dim=32)).qk_norm
    mistral = model_config_from_hf(_old_style(model_type="mistral", sliding_window=256))
    assert mistral.sliding_window == 256
    assert mistral.max_model_len == 256  # capped at the window: full attention stays exact


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model_type": "gpt2"}, "unsupported architecture"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
        ({"rope_scaling": {"rope_type": "linear"}}, "factor is required"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": False}}, "truncate"),
        ({"num_key_value_heads": 3}, "multiple of num_kv_heads"),
        ({"rope_theta": -1.0}, "theta"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_unsupported_configs_raise_model_load_error(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        model_config_from_hf(_old_style(**overrides))


def test_load_model_config_reads_generation_config(tiny_path: Path) -> None:
    config = load_model_config(tiny_path)
    assert config.model_type == "llama"
    assert config.num_kv_heads == 2
    assert config.eos_token_ids == (2, 0)  # <|im_end|> from config, <|endoftext|> from generation_config
    assert config.bos_token_id == 0


# ---- folder errors -------------------------------------------------------------------------


def test_missing_folder_config_and_weights(tmp_path: Path, tiny_path: Path) -> None:
    backend = TorchAttentionBackend()
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope", torch.float32, CPU, backend)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path, torch.float32, CPU, backend)
    (tmp_path / "config.json").write_text((tiny_path / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(tmp_path, torch.float32, CPU, backend)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        load_model(tmp_path, torch.float32, CPU, backend)
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model(tiny_path, torch.int8, CPU, backend)


def test_unsupported_architecture_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2}))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model_config(tmp_path)


def test_weights_not_matching_config(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path)
    backend = TorchAttentionBackend()
    _edit_config(path, intermediate_size=96)
    with pytest.raises(ModelLoadError, match="mlp.*_proj.weight.*has shape"):
        load_model(path, torch.float32, CPU, backend)
    _edit_config(path, intermediate_size=128)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="lacks 1 tensor.*up_proj"):
        load_model(path, torch.float32, CPU, backend)


def test_tied_checkpoint_with_duplicate_lm_head_and_sharded_weights(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, tie=True)
    tensors = load_file(path / "model.safetensors")
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # old checkpoints had it
    names = sorted(tensors)
    (path / "model.safetensors").unlink()
    save_file({n: tensors[n] for n in names[: len(names) // 2]}, path / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[len(names) // 2 :]}, path / "model-00002-of-00002.safetensors")
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM)
    assert config.tie_word_embeddings and model.lm_head is None
    assert torch.equal(model.embed_tokens, tensors["model.embed_tokens.weight"])


def test_max_model_len_override(tiny_path: Path) -> None:
    model, config = load_model(tiny_path, torch.float32, CPU, TorchAttentionBackend(), max_model_len=40)
    assert config.max_model_len == 40
    assert isinstance(model, LlamaForCausalLM)
    assert model.rotary.cos.shape[0] == 40
    with pytest.raises(ModelLoadError, match="max_model_len"):
        load_model(tiny_path, torch.float32, CPU, TorchAttentionBackend(), max_model_len=0)


# ---- KV cache tensors (engine/kv/kv_tensors.py) ----------------------------------------------


def test_kv_cache_allocation_and_sizing(tiny_path: Path) -> None:
    from weir.engine.config import CacheConfig

    config = load_model_config(tiny_path)
    caches = allocate_kv_caches(config, 5, 4, torch.bfloat16, CPU)
    assert len(caches) == config.num_layers
    assert caches[0].shape == (2, 5, 4, config.num_kv_heads, config.head_dim)
    assert caches[0].dtype == torch.bfloat16 and not caches[0].any()
    assert kv_cache_shape(config, 3, 16) == (2, 3, 16, 2, 16)
    assert num_blocks_for(CacheConfig(num_blocks=7), config, torch.float32) == 7
    block_bytes = 16 * config.kv_bytes_per_token(4)
    budget = CacheConfig(memory_budget_bytes=10 * block_bytes + 5)
    assert num_blocks_for(budget, config, torch.float32) == 10
    with pytest.raises(ValueError, match="at least 2"):
        num_blocks_for(CacheConfig(memory_budget_bytes=block_bytes), config, torch.float32)
