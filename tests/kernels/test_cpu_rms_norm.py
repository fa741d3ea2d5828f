"""weir.kernels.cpu_rms_norm (the C residual add + RMSNorm) against Hugging Face's float32 formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import cpu_rms_norm
from weir.kernels.cpu_rms_norm import add_rms_norm

pytestmark = pytest.mark.skipif(not cpu_rms_norm.available(), reason="no C compiler here")


def _hf(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = v.pow(2).mean(-1, keepdim=True)
    return weight * (v * torch.rsqrt(variance + eps))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 9),
    dim=st.integers(1, 700),
    with_residual=st.booleans(),
    eps=st.sampled_from([0.0, 1e-6, 1e-5]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_the_hf_formula_and_updates_the_residual_in_place(
    rows: int, dim: int, with_residual: bool, eps: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(dim, generator=gen)
    residual = torch.randn(rows, dim, generator=gen) if with_residual else None
    expected_stream = x + residual if residual is not None else x.clone()
    normed, stream = add_rms_norm(x, residual, weight, eps + 1e-12)
    assert torch.equal(stream, expected_stream)  # the same additions, bit for bit
    if residual is not None:
        assert stream is residual  # in place
    torch.testing.assert_close(normed, _hf(expected_stream, weight, eps + 1e-12), atol=1e-5, rtol=1e-5)


def test_a_strided_input_is_read_as_its_values() -> None:
    x = torch.randn(3, 32)[:, ::2]
    weight = torch.randn(16)
    normed, _ = add_rms_norm(x, None, weight, 1e-6)
    torch.testing.assert_close(normed, _hf(x, weight, 1e-6), atol=1e-5, rtol=1e-5)


def test_tensors_the_kernel_would_misread_are_refused() -> None:
    weight = torch.randn(8)
    x = torch.randn(2, 8)
    for bad_x, bad_residual in (
        (torch.randn(2, 7), None),  # another width
        (x.double(), None),
        (torch.randn(2, 2, 8), None),  # another rank
        (x, torch.randn(3, 8)),  # another row count
        (x, torch.randn(2, 16)[:, ::2]),  # a residual that is not contiguous
        (x, torch.randn(2, 8).double()),
    ):
        with pytest.raises(ValueError, match="float32 CPU"):
            add_rms_norm(bad_x, bad_residual, weight, 1e-6)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm(x, None, torch.randn(8).double(), 1e-6)
    with pytest.raises(ValueError, match="eps"):
        add_rms_norm(x, None, weight, -1.0)
