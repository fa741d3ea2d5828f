"""weir_bench.gpu_check: it fails clearly where it cannot run, renders its report, and (slow) a
whole CPU dry run on a tiny model under the Triton interpreter passes."""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # before kernels.* is imported: TRITON_INTERPRET=1 without CUDA

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.engine.tiny_models import make_tiny_model  # noqa: E402
from weir_bench.gpu_check import main, to_markdown  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would really run")
def test_without_cuda_it_stops_at_once_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path), "--model", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["sections"][0]["status"] == "error"
    assert "no CUDA device" in (tmp_path / "gpu_check.md").read_text()


def test_a_missing_model_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["--out", str(tmp_path), "--device", DEVICE.type, "--model", str(tmp_path / "nope"), "--quick"]
    )
    # the model is only opened by the sections: they report the error, the run fails
    assert code == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {s["name"]: s["status"] for s in report["sections"]}
    assert statuses["kernels"] == "pass"
    assert statuses["engine float32"] == "error"
    assert "nope" in next(s["error"] for s in report["sections"] if s["name"] == "engine float32")


def test_markdown_lists_failures_errors_and_rates() -> None:
    report = {
        "started": "now",
        "commit": "abc",
        "device": "NVIDIA H200",
        "torch": "2.13",
        "triton": "3.9",
        "sections": [
            {
                "name": "kernels",
                "status": "fail",
                "seconds": 1.0,
                "num_cases": 2,
                "cases": [
                    {
                        "kernel": "rotary",
                        "case": "h=9/3",
                        "dtype": "bfloat16",
                        "max_error": 0.5,
                        "tolerance": 0.03,
                        "passed": False,
                    },
                    {
                        "kernel": "silu_mul",
                        "case": "i",
                        "dtype": "float32",
                        "max_error": 0.0,
                        "tolerance": 1e-4,
                        "passed": True,
                    },
                ],
            },
            {
                "name": "engine float32",
                "status": "error",
                "seconds": 0.1,
                "error": "boom",
                "traceback": "Trace\nboom",
            },
            {
                "name": "decode float32",
                "status": "pass",
                "seconds": 3.0,
                "forward": [{"batch": 8, "mode": "forward graph", "tok_s": 2000.0, "roofline_tok_s": 8000.0}],
                "engine": [{"batch": 8, "mode": "engine graph", "tok_s": 1000.0, "roofline_tok_s": 8000.0}],
            },
        ],
    }
    md = to_markdown(report)
    assert "| rotary | h=9/3 | bfloat16 | 0.5 | 0.03 |" in md
    assert "silu_mul" not in md  # passing cases are only counted
    assert "Trace\nboom" in md
    assert "| 8 | forward graph | 2,000 | 8,000 | 25.0% |" in md
    assert "| 8 | engine graph | 1,000 | 8,000 | 12.5% |" in md


@pytest.mark.slow
def test_cpu_dry_run_of_the_whole_check_passes(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    out = tmp_path / "out"
    args = [
        "--out",
        str(out),
        "--device",
        DEVICE.type,
        "--model",
        str(model),
        "--quick",
        "--dtypes",
        "float32",
    ]
    args += ["--batch-sizes", "1,2", "--context-len", "32", "--decode-steps", "2"]
    assert main(args) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    engine = next(s for s in report["sections"] if s["name"] == "engine float32")
    assert engine["graph_vs_eager_differing_requests"] == [] and engine["decode_steps_replayed"] > 0
    decode = next(s for s in report["sections"] if s["name"] == "decode float32")
    modes = {row["mode"] for row in decode["forward"] + decode["engine"]}
    assert modes == {"forward eager", "forward graph", "engine eager", "engine graph"}
