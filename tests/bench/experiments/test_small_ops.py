"""weir_bench.experiments.small_ops: both forms of every op compute the same thing, and one short run
reports each op at each row count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weir.kernels import cpu_argmax, cpu_rms_norm, cpu_rope_kv, cpu_sample, cpu_silu_mul
from weir_bench.experiments import small_ops

pytestmark = pytest.mark.skipif(
    not all(m.available() for m in (cpu_argmax, cpu_rms_norm, cpu_rope_kv, cpu_sample, cpu_silu_mul)),
    reason="no C compiler",
)


@pytest.mark.parametrize("op", small_ops.OPS)
def test_both_forms_compute_the_same(op: str) -> None:
    table = small_ops.forms(op, 3)
    got, want = table["c"](), table["torch"]()
    if op == "rms_norm":
        got, want = got[0], want[0]  # (normed, residual stream)
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # sample: the same tokens


def test_a_short_run_reports_every_op_and_row_count(tmp_path: Path) -> None:
    out = tmp_path / "small_ops.json"
    assert small_ops.main(["--rows", "1", "2", "--calls", "3", "--reps", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["op"], r["rows"]) for r in report["results"]] == [
        (op, n) for op in small_ops.OPS for n in (1, 2)
    ]
    assert all(r["torch_us"] > 0 and r["c_us"] > 0 and r["torch_over_c"] > 0 for r in report["results"])
    with pytest.raises(ValueError, match="unknown op"):
        small_ops.forms("gelu", 1)
