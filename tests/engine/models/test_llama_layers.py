"""The decoder's layers alone (engine/models/llama_layers.py), against Hugging Face's modules on the
same weights; the whole model against `generate` is tests/engine/models/test_llama.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP as HfLlamaMLP
from transformers.models.llama.modeling_llama import LlamaRMSNorm as HfLlamaRMSNorm

from weir.engine.config import ModelConfig, RopeConfig
from weir.engine.models.llama_layers import Linear, LlamaMLP, RMSNorm, has_o_proj_bias
from weir.engine.models.native_ops import NativeOps
from weir.kernels import cpu_silu_mul

CPU = torch.device("cpu")


def _config(model_type: str = "llama", attention_bias: bool = False, mlp_bias: bool = False) -> ModelConfig:
    return ModelConfig(
        model_type=model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope=RopeConfig(),
        max_model_len=64,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
    )


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_rms_norm_matches_hf_and_its_one_op_form_gives_the_same_bits(
    rows: int, scale: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 32, generator=gen) * scale
    weight = torch.randn(32, generator=gen)
    ours = RMSNorm(32, 1e-6, torch.float32, CPU)
    hf = HfLlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(weight)
        hf.weight.copy_(weight)
    plain = ours(x)
    assert torch.equal(plain, hf(x))
    assert torch.equal(ours(x, fused=True), plain)


def test_rms_norm_in_bf16_ignores_fused_and_follows_hf_order() -> None:
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    ours = RMSNorm(32, 1e-5, torch.bfloat16, CPU)
    hf = HfLlamaRMSNorm(32, eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        ours.weight.fill_(0.5)
        hf.weight.fill_(0.5)
    assert torch.equal(ours(x, fused=True), hf(x))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_x_wt_plus_b_once_loaded(bias: bool) -> None:
    layer = Linear(6, 4, bias, torch.float32, CPU)
    assert not layer.weight.requires_grad  # an inference engine: no autograd state
    assert (layer.bias is not None) == bias
    with torch.no_grad():
        layer.weight.copy_(torch.randn(4, 6))
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(4))
    x = torch.randn(5, 6)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize(
    ("model_type", "attention_bias", "expected"),
    [("llama", True, True), ("qwen3", True, True), ("qwen2", True, False), ("llama", False, False)],
)
def test_o_proj_bias_follows_each_family(model_type: str, attention_bias: bool, expected: bool) -> None:
    assert has_o_proj_bias(_config(model_type, attention_bias)) is expected


@pytest.mark.parametrize(
    "native",
    [
        pytest.param(False, id="torch"),
        pytest.param(
            True,
            id="c-silu-mul",
            marks=pytest.mark.skipif(not cpu_silu_mul.available(), reason="no C compiler"),
        ),
    ],
)
@pytest.mark.parametrize("mlp_bias", [False, True])
def test_mlp_with_fused_gate_up_matches_hf_mlp(native: bool, mlp_bias: bool) -> None:
    config = _config(mlp_bias=mlp_bias)
    hf = HfLlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=48, mlp_bias=mlp_bias)).eval()
    ours = LlamaMLP(config, torch.float32, CPU, NativeOps(silu_mul=native))
    with torch.no_grad():
        gate, up = ours.gate_up_proj.weight.split(48)
        gate.copy_(hf.gate_proj.weight)
        up.copy_(hf.up_proj.weight)
        ours.down_proj.weight.copy_(hf.down_proj.weight)
        if mlp_bias:
            assert ours.gate_up_proj.bias is not None and ours.down_proj.bias is not None
            ours.gate_up_proj.bias.copy_(torch.cat([hf.gate_proj.bias, hf.up_proj.bias]))
            ours.down_proj.bias.copy_(hf.down_proj.bias)
        x = torch.randn(7, 32)
        expected = hf(x)
    got = ours(x)
    if native:  # the C SiLU rounds its exp differently (kernels/native/silu_mul.c)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
