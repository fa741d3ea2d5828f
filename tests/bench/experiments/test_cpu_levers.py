"""weir_bench.experiments.cpu_levers on a tiny model: every variant is timed, and switching leaves the
engine on the fused path with the threads it started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.packed_linear import packing_supported
from weir_bench.experiments.cpu_levers import main

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def test_one_run_times_every_variant_and_restores_the_threads(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "levers.json"
    threads = torch.get_num_threads()
    argv = ["--model", str(path), "--batches", "1", "3", "--context-len", "20", "--steps", "2", "--reps", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads
    report = json.loads(out.read_text())
    assert [r["batch"] for r in report["decode"]] == [1, 3]
    for row in report["decode"]:
        for name in ("unfused", "fused", "unfused_1thread", "fused_1thread", "weight_read"):
            assert row[f"{name}_ms"] > 0 and row[f"{name}_min_ms"] <= row[f"{name}_ms"]
        assert row["unfused_over_fused"] == pytest.approx(row["unfused_ms"] / row["fused_ms"], abs=0.01)


def test_the_weight_read_covers_every_weight_not_only_the_unpacked_parameters(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "levers.json"
    argv = ["--model", str(path), "--batches", "1", "--context-len", "8", "--steps", "1", "--reps", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    stored = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            stored += sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    assert json.loads(out.read_text())["weight_bytes"] == stored
