"""weir.kernels.cpu_argmax: the C row argmax against torch.argmax: random rows, ties (the first index),
infinities, NaNs (the first NaN), every tail length, strided rows; misread tensors refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import cpu_argmax

pytestmark = pytest.mark.skipif(not cpu_argmax.available(), reason="no C compiler")


@pytest.mark.parametrize(
    ("rows", "cols"), [(1, 49152), (8, 49152), (3, 1), (2, 15), (2, 16), (5, 17), (4, 100)]
)
def test_matches_torch_on_random_rows(rows: int, cols: int) -> None:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols))
    assert torch.equal(cpu_argmax.argmax_rows(x), x.argmax(dim=-1))


_values = st.sampled_from([0.0, 1.0, -1.0, 2.5, float("inf"), float("-inf"), float("nan"), -0.0, 3e38])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_values, min_size=40, max_size=40), min_size=1, max_size=3), st.integers(1, 40))
def test_ties_infinities_and_nans_follow_torch(rows: list[list[float]], cols: int) -> None:
    x = torch.tensor(rows, dtype=torch.float32)[:, :cols]  # a strided view: rows of 40, cols read
    assert torch.equal(cpu_argmax.argmax_rows(x), x.argmax(dim=-1))


def test_all_minus_infinity_answers_the_first_index() -> None:
    x = torch.full((2, 50), float("-inf"))
    assert cpu_argmax.argmax_rows(x).tolist() == [0, 0]
    assert cpu_argmax.argmax_rows(torch.empty(0, 7)).shape == (0,)
    transposed = torch.randn(30, 4).t()
    assert torch.equal(cpu_argmax.argmax_rows(transposed), transposed.argmax(dim=-1))


@pytest.mark.parametrize("bad", [torch.randn(2, 8, dtype=torch.float64), torch.randn(8), torch.randn(2, 0)])
def test_misread_tensors_are_refused(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="x must be"):
        cpu_argmax.argmax_rows(bad)
