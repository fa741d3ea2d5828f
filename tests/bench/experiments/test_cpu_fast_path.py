"""weir_bench.experiments.cpu_fast_path on a tiny model: every section runs, and its shapes are the model's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.models.llama_layers import Linear
from weir.engine.models.packed_linear import packing_supported
from weir.engine.runner.loader import load_model
from weir_bench.experiments.cpu_fast_path import gemm_shapes, main

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def test_gemm_shapes_are_the_loaded_layers(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen3", num_kv_heads=1, head_dim=32)
    model, config = load_model(path, torch.float32, torch.device("cpu"), TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    layers = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}
    shapes = gemm_shapes(config)
    for name, layer in layers.items():
        assert isinstance(layer, Linear)
        assert shapes[name] == tuple(layer.weight.shape), name
    assert shapes["lm_head"] == tuple(model.embed_tokens.shape)


def test_one_run_reports_linear_weight_read_and_interleaved_decode(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "report.json"
    argv = ["--model", str(path), "--linear-rows", "1", "4", "--batches", "1", "3"]
    assert main([*argv, "--context-len", "20", "--steps", "2", "--reps", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {(r["shape"], r["rows"]) for r in report["linear"]} == {
        (s, m) for s in ("qkv", "o", "gate_up", "down", "lm_head") for m in (1, 4)
    }
    assert all(r["f_linear_us"] > 0 and r["packed_us"] > 0 for r in report["linear"])
    assert report["weight_bytes"] > 0
    assert [r["batch"] for r in report["decode"]] == [1, 3]
    for row in report["decode"]:
        assert row["plain_ms"] > 0 and row["packed_ms"] > 0 and row["weight_read_ms"] > 0
        assert row["plain_over_packed"] == pytest.approx(row["plain_ms"] / row["packed_ms"], abs=0.01)
    assert report["decode"][0]["packed_over_first_batch"] == 1.0


def test_no_plain_times_the_packed_engine_against_a_full_weight_read(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out, out_plain = tmp_path / "alone.json", tmp_path / "both.json"
    argv = ["--model", str(path), "--linear-rows", "--batches", "1", "2", "--context-len", "12"]
    assert main([*argv, "--steps", "2", "--reps", "2", "--no-plain", "--out", str(out)]) == 0
    assert main([*argv, "--steps", "1", "--reps", "1", "--out", str(out_plain)]) == 0
    alone, both = json.loads(out.read_text()), json.loads(out_plain.read_text())
    assert "linear" not in alone
    assert alone["weight_bytes"] == both["weight_bytes"]  # the same weights read, from its own copy
    for row in alone["decode"]:
        assert "plain_ms" not in row and "plain_over_packed" not in row
        assert row["packed_ms"] > 0 and row["weight_read_ms"] > 0
        assert row["packed_over_weight_read"] == pytest.approx(
            row["packed_ms"] / row["weight_read_ms"], abs=0.01
        )
