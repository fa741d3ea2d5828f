"""weir_bench.experiments.decode_roofline on a tiny model: every variant and the weight read are timed
on both clocks, the variants are what they say (row weights, the fused-ops and attention
switches), and `rows_unfused` steps the `rows` engine, `torch_attention` the `packed` one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.native_ops import NativeOps
from weir.engine.models.packed_linear import PackedLinear, packing_supported
from weir.engine.models.row_weight_probe import measured_row_inputs
from weir.engine.runner.loader import load_model_config
from weir_bench.experiments.decode_roofline import _set_switches, build_variant, main

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def test_one_run_times_every_variant_on_both_clocks(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "roofline.json"
    threads = torch.get_num_threads()
    argv = ["--model", str(path), "--batches", "1", "3", "--context-len", "20", "--steps", "2", "--reps", "2"]
    try:
        assert main([*argv, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the experiment runs with one thread by default
    report = json.loads(out.read_text())
    assert report["threads"] == 1 and len(report["load_average"]) == 3
    assert [r["batch"] for r in report["decode"]] == [1, 3]
    for row in report["decode"]:
        for name in ("packed", "rows", "rows_auto", "rows_unfused", "torch_attention", "weight_read"):
            assert row[f"{name}_wall_ms"] > 0
            for clock in ("wall", "cpu"):  # thread CPU time may read 0 where it is counted in ticks
                assert 0 <= row[f"{name}_{clock}_min_ms"] <= row[f"{name}_{clock}_ms"]
        assert row["packed_over_rows_wall"] == pytest.approx(
            row["packed_wall_ms"] / row["rows_wall_ms"], rel=0.01
        )


def test_the_variants_are_what_they_say(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    cases = (
        ("packed", False, True, True, True),
        ("rows", True, True, True, True),
        ("rows_unfused", True, False, True, True),
        ("torch_attention", False, True, False, True),
        ("torch_norms", False, True, True, False),
    )
    for name, rows, fused, native, norms in cases:
        engine = build_variant(name, path, 2, 64)
        _set_switches(engine, name)
        model = engine.runner.model
        layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
        assert layers and all((m.row_weight_bytes > 0) == rows for m in layers), name
        assert model.fused_ops == fused, name
        assert all(layer.self_attn.attn_backend.native_decode == native for layer in model.layers), name
        assert model.native_ops.norms == (norms and model.native_ops_built.norms), name
        # the C decode layers where the model built them (row copies: engine/models/native_decode.py)
        built = dataclasses.replace(
            NativeOps.for_model(model.device, model.dtype), decode_layers=model.native_decode is not None
        )
        # the other small ops at what builds (the norms' switch is the one checked above)
        assert dataclasses.replace(model.native_ops, norms=built.norms) == built, name
    # the small ops' switches, each alone
    for name, off in (("torch_rope_kv", "rope_kv"), ("torch_silu_mul", "silu_mul")):
        engine = build_variant(name, path, 2, 64)
        _set_switches(engine, name)
        ops = engine.runner.model.native_ops
        built = NativeOps.for_model(engine.runner.model.device, engine.runner.model.dtype)
        assert not getattr(ops, off), name
        assert all(
            getattr(ops, other) == getattr(built, other) for other in ("rope_kv", "silu_mul") if other != off
        )
    # layer_by_layer: the decode layers' one C call off, every small op at what builds
    engine = build_variant("layer_by_layer", path, 2, 64)
    _set_switches(engine, "layer_by_layer")
    model = engine.runner.model
    assert not model.native_ops.decode_layers
    assert model.native_ops_built.decode_layers == (model.native_decode is not None)
    _set_switches(engine, "rows_auto")
    assert model.native_ops.decode_layers == model.native_ops_built.decode_layers
    # rows_auto: as served, the copies serve as many rows as this host's probe finds
    auto = build_variant("rows_auto", path, 2, 64)
    assert auto.cpu_row_inputs == measured_row_inputs(load_model_config(str(path)).layer_linear_shapes())


def test_wide_step_threads_step_the_engine_as_served_and_the_read_on_the_process_count(
    tmp_path: Path,
) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "roofline.json"
    threads = torch.get_num_threads()
    argv = ["--model", str(path), "--variants", "rows", "--batches", "1", "4", "--context-len", "20"]
    try:
        assert (
            main([*argv, "--steps", "2", "--reps", "2", "--wide-step-threads", "2", "--out", str(out)]) == 0
        )
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert (report["threads"], report["wide_step_threads"], report["wide_step_rows"]) == (1, 2, 4)
    engine = build_variant("rows", path, 4, 64, wide_step_threads=2)
    assert engine.runner.threads is not None
    assert (engine.runner.threads.decode_threads, engine.runner.threads.wide_threads) == (
        torch.get_num_threads(),
        2,
    )
    assert build_variant("rows", path, 4, 64).runner.threads is None  # no switch by default
