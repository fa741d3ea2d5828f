"""weir_bench.experiments.gil_contention on a tiny model: every (interval, duty) cell is timed, the busy
thread really runs beside the steps, and the process's switch interval is left as it was."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.packed_linear import packing_supported
from weir_bench.experiments.gil_contention import BusyThread, main, markdown

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


def test_one_run_times_every_cell_and_restores_the_switch_interval(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "gil.json"
    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    argv = ["--model", str(path), "--batch", "2", "--context-len", "8", "--steps", "2", "--reps", "2"]
    try:
        assert main([*argv, "--duties", "0.5", "--intervals-ms", "5", "0.5", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert sys.getswitchinterval() == interval
    rows = json.loads(out.read_text())["rows"]
    assert [(r["switch_interval_ms"], r["duty"]) for r in rows] == [
        (5.0, 0.0),
        (5.0, 0.5),
        (0.5, 0.0),
        (0.5, 0.5),
    ]
    for r in rows:
        assert r["step_ms"] > 0
        assert (r["busy_units_per_s"] > 0) == (r["duty"] > 0)  # the busy thread ran where asked
        if r["duty"] == 0:
            assert r["over_alone"] == 1.0
    assert "| 0.5 | 0.5 |" in markdown(rows)


def test_the_busy_thread_works_and_stops() -> None:
    with BusyThread(0.5) as busy:
        time.sleep(0.05)
    assert busy.units > 0 and not busy._thread.is_alive()
    with pytest.raises(ValueError, match="duty"):
        BusyThread(1.0)
