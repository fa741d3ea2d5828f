"""weir.kernels.cpu_silu_mul: the C silu(gate) * up against torch's, on SmolLM2's shapes and odd ones,
extreme values, strided rows; misread tensors refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from weir.kernels import cpu_silu_mul

pytestmark = pytest.mark.skipif(not cpu_silu_mul.available(), reason="no C compiler")


def _reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize(("rows", "width"), [(1, 1536), (8, 1536), (3, 17), (5, 1), (2, 33), (129, 64)])
def test_matches_torch(rows: int, width: int) -> None:
    gate_up = torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(rows * width)) * 4
    torch.testing.assert_close(cpu_silu_mul.silu_mul(gate_up), _reference(gate_up), rtol=2e-6, atol=1e-7)


def test_extreme_values_keep_torch_limits() -> None:
    gate = torch.tensor([[-1e4, -100.0, -88.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 100.0, 1e4, 3e38]])
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)], dim=1)
    got = cpu_silu_mul.silu_mul(gate_up)
    want = _reference(gate_up)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30)  # 3e38 * 2 overflows in both
    nan = cpu_silu_mul.silu_mul(torch.tensor([[float("nan"), 1.0, 1.0, float("nan")]]))
    assert torch.isnan(nan).all()


def test_rows_of_a_wider_view_are_read_in_place() -> None:
    wide = torch.randn(6, 40)
    view = wide[:, :32]  # row stride 40, width 16
    torch.testing.assert_close(cpu_silu_mul.silu_mul(view), _reference(view), rtol=2e-6, atol=1e-7)
    transposed = torch.randn(32, 6).t()  # column-major: copied first
    torch.testing.assert_close(
        cpu_silu_mul.silu_mul(transposed), _reference(transposed), rtol=2e-6, atol=1e-7
    )
    assert cpu_silu_mul.silu_mul(torch.empty(0, 8)).shape == (0, 4)


@pytest.mark.parametrize(
    "bad",
    [torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 7), torch.randn(8), torch.randn(2, 0)],
)
def test_misread_tensors_are_refused(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="gate_up must be"):
        cpu_silu_mul.silu_mul(bad)
