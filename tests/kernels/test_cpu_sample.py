"""weir.kernels.cpu_sample: the C draw from softmax(logits / t) against the cumulative distribution in
float64 (each token's interval holds u * total), torch's own draw, and the softmax itself (a grid of
uniform numbers lands on each token in proportion to its probability); masked tokens, NaNs, every
tail length, strided rows; misread tensors refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import cpu_sample

pytestmark = pytest.mark.skipif(not cpu_sample.available(), reason="no C compiler")


def _bracket_ok(x: torch.Tensor, t: float, u: float, token: int, slack: float = 1e-5) -> bool:
    """Whether u * total falls in token's interval of the float64 cumulative distribution of
    softmax(x / t), within `slack` of the total (the kernel sums in float32)."""
    w = torch.softmax(x.double() / t, dim=-1)
    cdf = w.cumsum(dim=-1)
    target = u * float(cdf[-1])
    before = float(cdf[token - 1]) if token else 0.0
    return float(w[token]) > 0 and before - slack <= target <= float(cdf[token]) + slack


@pytest.mark.parametrize("cols", [1, 15, 63, 64, 65, 1000, 49_152, 49_157])
def test_each_draw_lands_in_its_tokens_interval_and_matches_torchs_draw(cols: int) -> None:
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(6, cols, generator=gen) * 3.0
    t = torch.tensor([1.0, 0.5, 2.0, 0.7, 1.3, 1.0])
    u = torch.rand(6, generator=gen)
    got = cpu_sample.sample_rows(x, t, u)
    probs = (x / t[:, None]).softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    torch_draw = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)[:, 0].clamp(max=cols - 1)
    for r in range(6):
        assert _bracket_ok(x[r], float(t[r]), float(u[r]), int(got[r]))
    assert torch.equal(got, torch_draw)  # random u: no draw within a few ulp of a boundary


def test_a_grid_of_uniform_numbers_lands_on_each_token_in_proportion_to_its_probability() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0, float("-inf"), 0.5, -3.0]])
    for t in (1.0, 0.5, 3.0):
        p = torch.softmax(x[0].double() / t, dim=-1)
        n = 20_000
        u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        got = cpu_sample.sample_rows(x.expand(n, -1), torch.full((n,), t), u.float())
        counts = torch.bincount(got, minlength=6).double()
        assert counts[3] == 0  # the masked token
        assert torch.allclose(counts / n, p, atol=2 / n)


def test_masked_tokens_are_never_drawn_even_at_the_ends_of_u() -> None:
    x = torch.full((3, 200), float("-inf"))
    x[:, 70] = 1.0
    x[:, 150] = 1.0
    u = torch.tensor([0.0, 0.5, 0.99999994])
    got = cpu_sample.sample_rows(x, torch.ones(3), u).tolist()
    assert got == [70, 150, 150]


def test_rows_without_a_finite_logit_and_nans() -> None:
    x = torch.full((2, 80), float("-inf"))
    x[1, :] = float("nan")
    assert cpu_sample.sample_rows(x, torch.ones(2), torch.tensor([0.3, 0.9])).tolist() == [0, 0]
    y = torch.randn(1, 80)
    y[0, 5] = float("nan")  # a NaN has no weight; the others are drawn as before
    got = int(cpu_sample.sample_rows(y, torch.ones(1), torch.tensor([0.4]))[0])
    assert got != 5
    clean = y.clone()
    clean[0, 5] = float("-inf")
    assert got == int(cpu_sample.sample_rows(clean, torch.ones(1), torch.tensor([0.4]))[0])


def test_a_strided_view_and_an_empty_batch() -> None:
    base = torch.randn(40, 300)
    view = base[::2, 7:250]  # rows 600 floats apart, 243 columns read
    u = torch.rand(20)
    t = torch.full((20,), 0.9)
    assert torch.equal(cpu_sample.sample_rows(view, t, u), cpu_sample.sample_rows(view.contiguous(), t, u))
    assert cpu_sample.sample_rows(torch.empty(0, 7), torch.empty(0), torch.empty(0)).shape == (0,)


def test_misread_tensors_are_refused() -> None:
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="float32 CPU matrix"):
        cpu_sample.sample_rows(x.double(), torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match="float32 CPU matrix"):
        cpu_sample.sample_rows(torch.empty(2, 0), torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match="temperature"):
        cpu_sample.sample_rows(x, torch.ones(3), torch.zeros(2))
    with pytest.raises(ValueError, match="uniform"):
        cpu_sample.sample_rows(x, torch.ones(2), torch.zeros(2, dtype=torch.float64))


@settings(max_examples=150, deadline=None)
@given(
    cols=st.integers(1, 300),
    t=st.floats(0.05, 20.0),
    u=st.floats(0.0, 1.0, width=32, exclude_max=True),
    masked=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**16),
)
def test_any_row_draws_an_unmasked_token_in_its_interval(
    cols: int, t: float, u: float, masked: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, cols, generator=gen) * 4.0
    mask = torch.rand(1, cols, generator=gen) < masked
    mask[0, int(torch.randint(cols, (1,), generator=gen))] = False  # at least one token stays
    x = x.masked_fill(mask, float("-inf"))
    token = int(cpu_sample.sample_rows(x, torch.tensor([t]), torch.tensor([u]))[0])
    assert not mask[0, token]
    assert _bracket_ok(x[0], t, u, token, slack=1e-4)


@pytest.mark.parametrize("cols", [1, 63, 64, 65, 49_157])
def test_logsumexp_over_what_a_floor_keeps_matches_torch(cols: int) -> None:
    x = torch.randn(4, cols, generator=torch.Generator().manual_seed(cols)) * 5.0
    floor = torch.tensor([float("-inf"), float(x[1].median()), float(x[2].max()), float(x[3].max()) + 1.0])
    got = cpu_sample.logsumexp_rows(x, floor)
    want = x.masked_fill(x < floor[:, None], float("-inf")).logsumexp(dim=-1)
    torch.testing.assert_close(got[:3], want[:3], rtol=1e-6, atol=1e-5)
    assert got[3] == float("-inf")  # nothing at or above the floor
    with pytest.raises(ValueError, match="floor"):
        cpu_sample.logsumexp_rows(x, floor[:2])


def test_a_floor_gives_the_logits_below_it_no_chance() -> None:
    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(5)) * 2.0
    floor = torch.stack([x[0].max() - 0.5, x[1].kthvalue(490).values, torch.tensor(float("-inf"))])
    n = 300
    u = (torch.arange(n, dtype=torch.float32) + 0.5) / n
    for r in range(3):
        rows = x[r].expand(n, -1)
        got = cpu_sample.sample_rows(rows, torch.ones(n), u, floor[r].expand(n).contiguous())
        assert bool((x[r][got] >= floor[r]).all())
        masked = x[r].masked_fill(x[r] < floor[r], float("-inf")).expand(n, -1)
        assert torch.equal(got, cpu_sample.sample_rows(masked, torch.ones(n), u))  # the same as masking
