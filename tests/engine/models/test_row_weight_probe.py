"""The start-up measurement that decides the CPU row weights (engine/models/row_weight_probe.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import llm_engine
from engine.config import EngineConfig
from engine.models import row_weight_probe
from engine.models.packed_linear import packing_supported
from engine.models.row_weight_probe import MARGIN, RowWeightTiming, time_row_products

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def test_the_copies_are_kept_only_for_a_clear_win() -> None:
    assert RowWeightTiming(packed_s=1.0, rows_s=0.5).rows_win
    assert RowWeightTiming(packed_s=1.0, rows_s=MARGIN).rows_win
    assert not RowWeightTiming(packed_s=1.0, rows_s=0.95).rows_win  # faster, not by enough
    assert not RowWeightTiming(packed_s=1.0, rows_s=1.7).rows_win


def test_both_layouts_are_timed() -> None:
    timing = time_row_products(shape=(256, 128), reps=3)
    assert timing.packed_s > 0 and timing.rows_s > 0


@pytest.mark.parametrize("wins", [True, False])
def test_auto_follows_the_measurement_and_an_explicit_choice_is_not_measured(
    monkeypatch: pytest.MonkeyPatch, wins: bool
) -> None:
    calls: list[int] = []

    def measured() -> bool:
        calls.append(1)
        return wins

    monkeypatch.setattr(row_weight_probe, "row_weights_win", measured)
    base = EngineConfig(model_path="/m", device="cpu", dtype="float32")
    assert llm_engine.uses_row_weights(base) is wins and calls == [1]
    assert llm_engine.uses_row_weights(dataclasses.replace(base, cpu_row_weights=not wins)) is (not wins)
    assert not llm_engine.uses_row_weights(dataclasses.replace(base, dtype="bfloat16"))
    assert not llm_engine.uses_row_weights(dataclasses.replace(base, cpu_packed_linear=False))
    assert calls == [1]  # only auto in float32 on the packed path measures
