"""weir.kernels.rms_norm against the model's torch RMSNorm (the CPU path)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import bf16_slack
from weir.engine.models.llama_layers import RMSNorm
from weir.kernels.rms_norm import fused_add_rms_norm, rms_norm

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _norm(hidden: int, dtype: torch.dtype, device: torch.device) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-6, dtype, device)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(7)))
    return norm


def _rand(*shape: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    return (3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(
        device=device, dtype=dtype
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 100, 576])
def test_rms_norm_matches_torch(device: torch.device, dtype: torch.dtype, hidden: int) -> None:
    norm = _norm(hidden, dtype, device)
    x = _rand(13, hidden, dtype=dtype, device=device, seed=1)
    atol, rtol = TOL[dtype]
    rtol += 2 * bf16_slack(dtype)
    torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_add_matches_add_then_norm(device: torch.device, dtype: torch.dtype) -> None:
    hidden = 96
    norm = _norm(hidden, dtype, device)
    x = _rand(11, hidden, dtype=dtype, device=device, seed=2)
    residual = _rand(11, hidden, dtype=dtype, device=device, seed=3)
    expected_residual = x + residual
    expected = norm(expected_residual)
    out, new_residual = fused_add_rms_norm(x, residual, norm.weight, norm.eps)
    assert new_residual is residual
    # one rounding of the same fp32 sum: bit-identical (to an ulp under the interpreter)
    torch.testing.assert_close(residual, expected_residual, atol=0, rtol=bf16_slack(dtype))
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol + 2 * bf16_slack(dtype))


def test_row_strided_input_and_out_argument(device: torch.device) -> None:
    norm = _norm(32, torch.float32, device)
    wide = _rand(5, 80, dtype=torch.float32, device=device, seed=4)
    x = wide[:, 8:40]  # rows 80 apart, last dim contiguous
    out = torch.empty(5, 32, device=device)
    assert rms_norm(x, norm.weight, norm.eps, out=out) is out
    torch.testing.assert_close(out, norm(x), atol=1e-5, rtol=1e-5)


def test_empty_input(device: torch.device) -> None:
    norm = _norm(16, torch.float32, device)
    assert rms_norm(torch.empty(0, 16, device=device), norm.weight, norm.eps).shape == (0, 16)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x, r, w: rms_norm(x[:, :10], w, 1e-6), "x has size 10 in dimension 1"),
        (lambda x, r, w: rms_norm(x.half(), w, 1e-6), "x must have dtype"),
        (lambda x, r, w: rms_norm(x.t(), w, 1e-6), "x"),
        (lambda x, r, w: rms_norm(x, w[None], 1e-6), "weight must have 1 dimensions"),
        (lambda x, r, w: rms_norm(x, w, -1.0), "eps must be >= 0"),
        (lambda x, r, w: fused_add_rms_norm(x, r[:2], w, 1e-6), "residual has size 2 in dimension 0"),
        (lambda x, r, w: rms_norm(x, w, 1e-6, out=torch.empty_like(x)[:1]), "out has size 1"),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, call, message: str) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match=message):
        call(x, torch.randn(4, 16, device=device), torch.ones(16, device=device))
