"""weir.engine.models.native_ops: the C small ops are on for a float32 CPU model where they build, off
elsewhere, and one object is shared by the model and every layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.models.native_ops import NativeOps
from weir.engine.runner.loader import load_model
from weir.kernels import cpu_rms_norm, cpu_rope_kv, cpu_silu_mul

CPU = torch.device("cpu")


def test_on_where_the_kernels_build_on_a_float32_cpu_model_only() -> None:
    on = NativeOps.for_model(CPU, torch.float32)
    assert on == NativeOps(
        norms=cpu_rms_norm.available(), rope_kv=cpu_rope_kv.available(), silu_mul=cpu_silu_mul.available()
    )
    assert NativeOps.for_model(CPU, torch.bfloat16) == NativeOps()
    assert NativeOps.for_model(torch.device("cuda"), torch.float32) == NativeOps()  # no CUDA needed to ask


def test_one_switch_reaches_every_layer(tmp_path: Path) -> None:
    model, _ = load_model(
        make_tiny_model(tmp_path, num_kv_heads=2), torch.float32, CPU, TorchAttentionBackend()
    )
    assert isinstance(model, LlamaForCausalLM)
    model.native_ops.rope_kv = False
    assert all(layer.self_attn.native_ops is model.native_ops for layer in model.layers)
    assert all(layer.mlp.native_ops is model.native_ops for layer in model.layers)
    assert not any(layer.self_attn.native_ops.rope_kv for layer in model.layers)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_cpu_model_keeps_the_torch_forms(tmp_path: Path, dtype: torch.dtype) -> None:
    model, _ = load_model(make_tiny_model(tmp_path), dtype, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM) and model.native_ops == NativeOps()
