"""weir.kernels.cpu_small_gemm (the C kernel over a weight packed in panels) against torch.nn.functional.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import cpu_small_gemm
from weir.kernels.cpu_small_gemm import MAX_ROWS, SmallGemm, pack_panels, panel_width, small_gemm

pytestmark = pytest.mark.skipif(not cpu_small_gemm.available(), reason="no C compiler here")


@pytest.mark.parametrize("rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(960, 576), (576, 1536), (33, 1537), (5, 3), (1, 16)],
    ids=["qkv", "down", "odd", "tiny", "one-column"],
)
def test_every_row_count_matches_f_linear(rows: int, out_features: int, in_features: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    torch.testing.assert_close(small_gemm(x, weight), F.linear(x, weight), atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(small_gemm(x, weight, bias), F.linear(x, weight, bias), atol=2e-4, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, MAX_ROWS),
    out_features=st.integers(1, 300),
    in_features=st.integers(1, 700),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_shape_and_thread_count_matches_f_linear(
    rows: int, out_features: int, in_features: int, threads: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the kernel splits the output columns over this many threads
    try:
        got = small_gemm(x, weight)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-4 * in_features**0.5, rtol=1e-5)


def test_a_strided_input_is_read_as_its_values() -> None:
    weight = torch.randn(40, 24)
    x = torch.randn(3, 48)[:, ::2]  # a column slice, as after splitting a fused projection
    torch.testing.assert_close(SmallGemm(weight)(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)


def test_inputs_the_kernel_would_misread_are_refused() -> None:
    gemm = SmallGemm(torch.randn(8, 16))
    for bad in (
        torch.randn(0, 16),  # no rows
        torch.randn(MAX_ROWS + 1, 16),  # more rows than the kernel's loops
        torch.randn(2, 15),  # another width
        torch.randn(2, 16, dtype=torch.float64),
        torch.randn(2, 2, 16),  # another rank
    ):
        with pytest.raises(ValueError, match="float32 CPU matrix"):
            gemm(bad)
    with pytest.raises(ValueError, match="float32 CPU matrix"):
        gemm("not a tensor")  # type: ignore[arg-type]


def test_the_panels_hold_each_output_columns_weights_side_by_side() -> None:
    width = panel_width()
    weight = torch.randn(2 * width + 3, 5)  # two full panels and a padded one
    panels = pack_panels(weight)
    assert panels.shape == (3, 5, width)
    for o in range(weight.shape[0]):
        torch.testing.assert_close(panels[o // width, :, o % width], weight[o], rtol=0, atol=0)
    assert not panels[2, :, 3:].any()  # the padding is zeros


def test_a_strided_weight_is_packed_as_its_values() -> None:
    weight = torch.randn(24, 40).t()  # not contiguous: the panels are a copy whatever the strides
    x = torch.randn(5, 24)
    gemm = SmallGemm(weight)
    torch.testing.assert_close(gemm(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    assert gemm.nbytes == pack_panels(weight).numel() * 4


def test_weights_and_biases_the_kernel_would_misread_are_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        SmallGemm(torch.randn(8, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="dimensions"):
        SmallGemm(torch.randn(8))
    with pytest.raises(ValueError, match="empty"):
        SmallGemm(torch.randn(0, 16))
    with pytest.raises(ValueError, match="bias of 7"):
        SmallGemm(torch.randn(8, 16), torch.randn(7))


@pytest.mark.parametrize("threads", [2, 3])
def test_many_panels_on_threads_give_the_one_thread_bits(threads: int) -> None:
    # Enough panels for chunks of several panels handed out as threads come free, with a ragged
    # last chunk and a padded last panel: each panel's sums are the same whoever computes it.
    out_features = panel_width() * (32 * threads + 7) + 5
    gen = torch.Generator().manual_seed(threads)
    weight = torch.randn(out_features, 64, generator=gen)
    x = torch.randn(MAX_ROWS, 64, generator=gen)
    gemm = SmallGemm(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = gemm(x)
        torch.set_num_threads(threads)
        shared = gemm(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(shared, alone)
    torch.testing.assert_close(shared, F.linear(x, weight), atol=1e-4 * 8, rtol=1e-5)
