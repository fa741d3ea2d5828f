"""weir_bench.experiments.step_contention on a tiny model: every load's blocks are stepped and summarised,
the load is a separate process that is gone after its block, and bad `--burn` values are refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.packed_linear import packing_supported
from weir.kernels import cpu_work_pool
from weir_bench.experiments import step_contention
from weir_bench.experiments.step_contention import main, parse_burn, summarize


@pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)
def test_each_load_gets_its_blocks_and_its_burner_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    started = []
    real = step_contention._burner

    def spy(busy_ms: float, idle_ms: float, bound_s: float):  # type: ignore[no-untyped-def]
        proc = real(busy_ms, idle_ms, bound_s)
        started.append(proc)
        return proc

    monkeypatch.setattr(step_contention, "_burner", spy)
    out = tmp_path / "contention.json"
    threads = torch.get_num_threads()
    argv = ["--model", str(path), "--batch", "2", "--threads", "1", "--context-len", "8"]
    argv += ["--max-model-len", "96", "--steps", "3", "--rounds", "2", "--warmup", "1"]
    argv += ["--burn", "1/1", "2/0"]
    try:
        assert main([*argv, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert list(report["steps"]) == ["omp", "pool"]
    for by_load in report["steps"].values():
        assert list(by_load) == ["quiet", "1/1", "2/0"]
        for summary in by_load.values():
            assert summary["steps"] == 6  # 2 rounds x 3 steps
            assert 0 < summary["median_ms"] <= summary["p90_ms"] <= summary["max_ms"]
    assert len(started) == 8  # one burner per loaded block: 2 rounds x 2 modes x 2 loads
    assert all(proc.poll() is not None for proc in started)
    assert cpu_work_pool.pool_threads() == 0  # the pool count is put back


def test_runs_that_would_outgrow_the_context_are_refused(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    with pytest.raises(SystemExit, match="must fit"):
        main(["--model", str(path), "--context-len", "8", "--max-model-len", "32", "--steps", "12"])


def test_burn_values_parse_or_are_refused() -> None:
    assert parse_burn("3/12") == (3.0, 12.0)
    assert parse_burn("0.5/0") == (0.5, 0.0)
    for bad in ("3", "a/b", "0/5", "3/-1", "1/2/3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_burn(bad)


def test_summary_reads_the_sorted_times() -> None:
    times = [float(v) for v in range(10, 0, -1)]
    assert summarize(times) == {"median_ms": 5.5, "p90_ms": 10.0, "max_ms": 10.0, "steps": 10}
