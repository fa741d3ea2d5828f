"""weir.kernels.silu_mul against torch's silu(gate) * up."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.interpret import bf16_slack
from weir.kernels.silu_mul import silu_mul

TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("intermediate", [40, 1536])
def test_matches_torch(device: torch.device, dtype: torch.dtype, intermediate: int) -> None:
    x = (4 * torch.randn(7, 2 * intermediate, generator=torch.Generator().manual_seed(1))).to(device, dtype)
    gate, up = x.split(intermediate, dim=-1)
    atol, rtol = TOL[dtype]
    rtol += 2 * bf16_slack(dtype)  # two roundings
    torch.testing.assert_close(silu_mul(x), F.silu(gate) * up, atol=atol, rtol=rtol)


def test_row_strided_input_and_out_argument(device: torch.device) -> None:
    wide = torch.randn(3, 50, device=device)
    x = wide[:, :48]
    out = torch.empty(3, 24, device=device)
    assert silu_mul(x, out=out) is out
    torch.testing.assert_close(out, F.silu(x[:, :24]) * x[:, 24:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: silu_mul(x[:, :7]), "x must have an even last dimension"),
        (lambda x: silu_mul(x[0]), "x must have 2 dimensions"),
        (lambda x: silu_mul(x.int()), "x must have dtype"),
        (lambda x: silu_mul(x, out=torch.empty(2, 5, device=x.device)), "out has size 5 in dimension 1"),
        (lambda x: silu_mul(x, out=torch.empty(2, 4, device=x.device).half()), "out must have dtype"),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call(torch.randn(2, 8, device=device))
