"""bench.experiments.cpu_levers on a tiny model: every variant is timed, and switching leaves the
engine on the fused path with the threads it started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.experiments.cpu_levers import main
from engine.models.packed_linear import packing_supported
from tests.engine.tiny_models import make_tiny_model

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
