"""The start-up measurement that decides the CPU row weights (engine/models/row_weight_probe.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine import engine_builder
from weir.engine.config import EngineConfig
from weir.engine.models import row_weight_probe
from weir.engine.models.packed_linear import packing_supported
from weir.engine.models.row_weight_probe import MARGIN, RowWeightTiming, probe_shapes, time_row_products
from weir.engine.runner.loader import load_model_config
from weir.kernels import cpu_small_gemm

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def _timing(packed: tuple[float, ...], rows: tuple[float, ...]) -> RowWeightTiming:
    return RowWeightTiming(rows=(1, 2, 4, 8, 16)[: len(packed)], packed_s=packed, rows_s=rows)


def test_the_copies_are_kept_only_for_a_clear_win_at_one_row() -> None:
    assert _timing((1.0,), (0.5,)).rows_win and _timing((1.0,), (0.5,)).row_inputs == 1
    assert _timing((1.0,), (MARGIN,)).rows_win
    assert not _timing((1.0,), (0.95,)).rows_win  # faster, not by enough
    assert _timing((1.0,), (0.95,)).row_inputs == 0
    assert not _timing((1.0, 1.0), (1.7, 0.1)).rows_win
    assert _timing((1.0, 1.0), (1.7, 0.1)).row_inputs == 0  # a win at 2 rows alone does not count


def test_once_kept_the_copies_serve_every_row_count_up_to_the_last_that_is_not_slower() -> None:
    assert _timing((1.0, 1.0, 1.0, 1.0), (0.5, 0.9, 1.0, 2.0)).row_inputs == 4
    assert _timing((1.0, 1.0, 1.0, 1.0), (0.5, 1.1, 0.5, 0.5)).row_inputs == 1  # up to the first loss
    assert _timing((1.0, 1.0, 1.0, 1.0), (0.5, 0.5, 0.5, 0.5)).row_inputs == 8
    assert _timing((1.0,) * 5, (0.5,) * 5).row_inputs == 16  # the C kernel's reach, in two groups of 8


@pytest.mark.parametrize("native", [True, False])
def test_each_row_count_is_timed_on_both_layouts(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    if native and not cpu_small_gemm.available():
        pytest.skip("no C compiler: the C kernel is not built")
    monkeypatch.setattr(row_weight_probe, "row_copy_native", lambda: native)
    timing = time_row_products(((256, 128), (64, 256)), total_bytes=1 << 20, reps=3)
    # without the C kernel the transposed copy serves one row only, so only one row is timed
    assert timing.rows == ((1, 2, 4, 8, 16) if native else (1,))
    assert len(timing.packed_s) == len(timing.rows_s) == len(timing.rows)
    assert all(t > 0 for t in (*timing.packed_s, *timing.rows_s))


def test_the_probe_repeats_the_layer_shapes_up_to_its_size() -> None:
    assert probe_shapes(((4, 8), (2, 8)), total_bytes=4 * 8 * 10) == [(4, 8), (2, 8), (4, 8)]
    assert probe_shapes(((1 << 20, 1024),), total_bytes=1 << 22) == [(1024, 1024)]  # cut to the size
    assert probe_shapes(((1, 1 << 30),), total_bytes=16) == [(1, 1 << 30)]  # at least one row
    assert len(probe_shapes(((2, 2),), total_bytes=1 << 30, max_weights=7)) == 7  # a tiny model: capped
    assert len(probe_shapes(((2, 2),))) == row_weight_probe.MAX_WEIGHTS
    for bad in ((), ((0, 8),)):
        with pytest.raises(ValueError, match="shapes"):
            probe_shapes(bad)


@pytest.mark.parametrize("measured", [0, 1, 4])
def test_auto_follows_the_measurement_and_an_explicit_choice_is_not_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, measured: int
) -> None:
    calls: list[tuple[tuple[int, int], ...]] = []

    def measure(shapes: tuple[tuple[int, int], ...]) -> int:
        calls.append(tuple(shapes))
        return measured

    monkeypatch.setattr(row_weight_probe, "measured_row_inputs", measure)
    path = make_tiny_model(tmp_path, num_kv_heads=2)
    shapes = load_model_config(path).layer_linear_shapes()
    base = EngineConfig(model_path=str(path), device="cpu", dtype="float32")
    assert engine_builder.row_weight_inputs(base) == measured and calls == [shapes]
    assert engine_builder.uses_row_weights(base) is (measured > 0)
    assert engine_builder.row_weight_inputs(dataclasses.replace(base, cpu_row_weights=True)) == 1
    assert engine_builder.row_weight_inputs(dataclasses.replace(base, cpu_row_weights=False)) == 0
    assert engine_builder.row_weight_inputs(dataclasses.replace(base, dtype="bfloat16")) == 0
    assert engine_builder.row_weight_inputs(dataclasses.replace(base, cpu_packed_linear=False)) == 0
    assert calls == [shapes, shapes]  # only auto in float32 on the packed path measures
