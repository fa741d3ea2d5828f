"""RoPE: inverse frequencies, cos/sin tables and rotation against transformers' own code."""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

# runner.loader imports the model and its Triton attention kernels: set TRITON_INTERPRET=1 (no
# CUDA) first, or a kernel test collected after this module finds them compiled for a GPU.
kernel_device()

from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

from weir.engine.config import RopeConfig, RopeScalingType  # noqa: E402
from weir.engine.models.rope import RotaryEmbedding, compute_inv_freq, yarn_attention_factor  # noqa: E402
from weir.engine.runner.loader import rope_config_from_hf  # noqa: E402

HEAD_DIM = 32
MAX_POS = 256

SCALINGS: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_attention_factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "attention_factor": 1.3,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 32,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
}


def _hf_config(scaling: dict[str, Any], theta: float = 10000.0, max_pos: int = MAX_POS) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_theta": theta, **scaling},
    )


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_inv_freq_and_table_match_hf_bit_for_bit(name: str) -> None:
    hf_config = _hf_config(SCALINGS[name])
    rope = rope_config_from_hf(hf_config)
    hf_rope = LlamaRotaryEmbedding(hf_config)
    inv_freq, scale = compute_inv_freq(rope, HEAD_DIM)
    assert torch.equal(inv_freq, hf_rope.inv_freq)
    assert scale == hf_rope.attention_scaling

    ours = RotaryEmbedding(rope, HEAD_DIM, MAX_POS, torch.float32, torch.device("cpu"))
    positions = torch.arange(MAX_POS)
    cos, sin = hf_rope(torch.zeros(1), positions[None])  # [1, MAX_POS, HEAD_DIM]
    half = HEAD_DIM // 2
    torch.testing.assert_close(ours.cos, cos[0, :, :half], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.sin, sin[0, :, :half], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_matches_hf_rotation(dtype: torch.dtype) -> None:
    hf_config = _hf_config(SCALINGS["yarn"])
    rope = rope_config_from_hf(hf_config)
    ours = RotaryEmbedding(rope, HEAD_DIM, MAX_POS, dtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    num_tokens, num_heads, num_kv_heads = 11, 4, 2
    q = torch.randn(num_tokens, num_heads, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
    positions = torch.tensor([0, 1, 2, 200, 3, 17, 255, 64, 65, 5, 9])

    q_out, k_out = ours.apply(q, k, positions)

    cos, sin = LlamaRotaryEmbedding(hf_config)(q, positions[None])  # [1, T, D] in dtype
    # HF layout is [batch, heads, seq, dim]
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    tol = 0 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), atol=tol, rtol=tol)
    torch.testing.assert_close(k_out, k_ref[0].transpose(0, 1), atol=tol, rtol=tol)


def test_dynamic_ntk_matches_hf_decoding_past_max_positions() -> None:
    """Within max_position_embeddings dynamic == default; past it, each position uses the
    frequencies HF's rotary embedding computes when decoding that position one at a time."""
    max_pos = 32
    hf_config = _hf_config(SCALINGS["dynamic"], max_pos=max_pos)
    rope = rope_config_from_hf(hf_config)
    ours = RotaryEmbedding(rope, HEAD_DIM, 3 * max_pos, torch.float32, torch.device("cpu"))
    hf_rope = LlamaRotaryEmbedding(hf_config)
    cos, _ = hf_rope(torch.zeros(1), torch.arange(max_pos)[None])  # prefill within the limit
    torch.testing.assert_close(ours.cos[:max_pos], cos[0, :, : HEAD_DIM // 2], atol=1e-6, rtol=0)
    for p in range(max_pos, 3 * max_pos):
        cos, sin = hf_rope(torch.zeros(1), torch.tensor([[p]]))
        torch.testing.assert_close(ours.cos[p], cos[0, 0, : HEAD_DIM // 2], atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.sin[p], sin[0, 0, : HEAD_DIM // 2], atol=1e-6, rtol=0)
    # the scaling really changes something past the limit
    default = RotaryEmbedding(
        RopeConfig(theta=10000.0, max_position_embeddings=max_pos),
        HEAD_DIM,
        3 * max_pos,
        torch.float32,
        torch.device("cpu"),
    )
    assert torch.equal(default.cos[:max_pos], ours.cos[:max_pos])
    assert not torch.allclose(default.cos[-1], ours.cos[-1])


def test_yarn_attention_factor_defaults() -> None:
    assert yarn_attention_factor(RopeConfig(scaling_type=RopeScalingType.YARN, factor=1.0)) == 1.0
    derived = yarn_attention_factor(RopeConfig(scaling_type=RopeScalingType.YARN, factor=4.0))
    assert derived == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1.0)
    explicit = RopeConfig(scaling_type=RopeScalingType.YARN, factor=4.0, attention_factor=0.7)
    assert yarn_attention_factor(explicit) == 0.7


def test_partial_rotary_and_odd_head_dim_are_rejected() -> None:
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RotaryEmbedding(RopeConfig(partial_rotary_factor=0.5), 32, 16, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(RopeConfig(), 31, 16, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="max_positions"):
        RotaryEmbedding(RopeConfig(), 32, 0, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_joint_rotation_of_q_and_k_equals_apply_bit_for_bit(dtype: torch.dtype) -> None:
    """The fused path rotates q and k heads side by side in one strided view of the qkv output."""
    rope = rope_config_from_hf(_hf_config(SCALINGS["yarn"]))
    ours = RotaryEmbedding(rope, HEAD_DIM, MAX_POS, dtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_heads, num_kv_heads = 7, 4, 2
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * HEAD_DIM, generator=gen).to(dtype)
    positions = torch.tensor([0, 3, 200, 255, 17, 64, 9])
    q = qkv[:, : num_heads * HEAD_DIM].view(num_tokens, num_heads, HEAD_DIM)
    k = qkv[:, num_heads * HEAD_DIM : (num_heads + num_kv_heads) * HEAD_DIM].view(
        num_tokens, num_kv_heads, HEAD_DIM
    )
    q_ref, k_ref = ours.apply(q, k, positions)

    qk = qkv[:, : (num_heads + num_kv_heads) * HEAD_DIM].view(num_tokens, num_heads + num_kv_heads, HEAD_DIM)
    joint = RotaryEmbedding.rotate(qk, *ours.tables(positions))

    assert torch.equal(joint[:, :num_heads], q_ref)
    assert torch.equal(joint[:, num_heads:], k_ref)
