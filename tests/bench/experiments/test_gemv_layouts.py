"""weir_bench.experiments.gemv_layouts: every layout gives the same product, and one run reports each
against the `sum` of the same bytes."""

from __future__ import annotations

import pytest
import torch

from weir.engine.models.packed_linear import packing_supported
from weir.kernels import cpu_small_gemm
from weir_bench.experiments import gemv_layouts

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.float32, torch.device("cpu")), reason="no oneDNN in this torch"
)


@pytest.fixture
def small_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemv_layouts, "SHAPES", [(48, 32), (32, 64), (96, 32)])


@pytest.mark.usefixtures("small_shapes")
@pytest.mark.parametrize("rows", [1, 3])
def test_every_layout_computes_the_same_products(rows: int) -> None:
    table, num_bytes = gemv_layouts.variants(rows)
    assert num_bytes == (48 * 32 + 32 * 64 + 96 * 32) * 4
    with torch.inference_mode():
        results = {name: fn() for name, fn in table.items() if name != "sum"}
    reference = results["f_linear"]
    for name, outs in results.items():
        for got, want in zip(outs, reference, strict=True):  # type: ignore[call-overload]
            torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.usefixtures("small_shapes")
def test_one_run_reports_every_layout_against_the_sum() -> None:
    report = gemv_layouts.run(rows=1, reps=2)
    assert report["rows"] == 1 and report["sum"]["over_sum_wall"] == 1.0
    names = ["packed", "f_linear", "nk_mv", "kn", "nk_t", "kn_t"]
    if cpu_small_gemm.available():
        names.append("c_kernel")
    for name in names:
        # wall time comes from perf_counter (never zero); thread CPU time may be counted in ticks,
        # so a tiny product can show 0 CPU time (CI saw it) and a zero base gives no ratio
        assert report[name]["over_sum_wall"] > 0 and report[name]["cpu_ms"] >= 0
        cpu_ratio = report[name]["over_sum_cpu"]
        assert cpu_ratio is None or cpu_ratio >= 0
