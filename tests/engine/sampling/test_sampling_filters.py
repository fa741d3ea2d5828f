"""Tests of engine/sampling/sampling_filters.py: top-k, top-p and min-p mask exactly the tokens their
definitions exclude, ties kept, rows without a filter untouched, and the top-p shortcut over the
best candidates equals the full sort. The sampler drawing from what is left: test_sampler.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import weir.engine.sampling.sampling_filters as sampling_filters
from tests.engine.sampling_strategies import row_params
from weir.engine.request import SamplingParams
from weir.engine.sampling.sampling_filters import apply_filters, filter_floors
from weir.kernels import cpu_sample

NEG_INF = float("-inf")


def random_logits(rows: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3.0


def _filter(logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]) -> torch.Tensor:
    return apply_filters(logits, torch.tensor(top_k), torch.tensor(top_p), torch.tensor(min_p))


def test_rows_without_a_filter_are_untouched_beside_rows_with_one() -> None:
    logits = random_logits(3, seed=1, vocab=30)
    out = _filter(logits, [30, 2, 30], [1.0, 1.0, 0.5], [0.0, 0.0, 0.0])
    assert torch.equal(out[0], logits[0])
    assert int((out[1] > NEG_INF).sum()) == 2
    assert 1 <= int((out[2] > NEG_INF).sum()) < 30


def test_top_k_keeps_every_tie_of_the_kth_logit() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    out = _filter(logits, [2], [1.0], [0.0])
    assert (out[0] > NEG_INF).tolist() == [False, True, True, True, False]


@pytest.mark.parametrize(("top_p", "kept"), [(0.4, 1), (0.75, 2), (0.79, 2), (0.81, 3), (0.99, 4)])
def test_top_p_keeps_the_smallest_nucleus_reaching_p(top_p: float, kept: int) -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = _filter(logits, [4], [top_p], [0.0])
    assert int((out[0] > NEG_INF).sum()) == kept
    assert torch.equal(out[0, :kept], logits[0, :kept])  # the kept logits keep their values


def test_min_p_is_relative_to_the_most_likely_token() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = _filter(logits, [4], [1.0], [0.31])
    assert (out[0] > NEG_INF).tolist() == [True, True, False, False]  # 0.15 < 0.31 * 0.5


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(2, 40),
    batch=st.lists(row_params, min_size=1, max_size=6),
)
def test_top_p_candidates_shortcut_equals_full_sort(
    seed: int, vocab: int, batch: list[SamplingParams]
) -> None:
    logits = random_logits(len(batch), seed=seed, vocab=vocab) / 3.0  # flat rows: wide nuclei
    top_k = torch.tensor([vocab if p.top_k < 0 else min(p.top_k, vocab) for p in batch])
    top_p = torch.tensor([p.top_p for p in batch])
    min_p = torch.tensor([p.min_p for p in batch])
    full = apply_filters(logits, top_k, top_p, min_p, num_top_p_candidates=vocab)
    for num_candidates in (1, 2, 5):
        shortcut = apply_filters(logits, top_k, top_p, min_p, num_top_p_candidates=num_candidates)
        assert torch.equal(shortcut, full)


def test_no_filter_is_no_floor_and_the_logits_themselves() -> None:
    logits = random_logits(2, seed=3, vocab=20)
    off = ([20, 20], [1.0, 1.0], [0.0, 0.0])
    assert filter_floors(logits, *(torch.tensor(v) for v in off)) is None
    assert _filter(logits, *off) is logits


@pytest.mark.parametrize("c_kernel", [True, False])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.lists(row_params, min_size=1, max_size=5))
def test_the_floors_mask_exactly_what_the_filters_exclude_with_or_without_the_c_normaliser(
    c_kernel: bool, seed: int, batch: list[SamplingParams]
) -> None:
    """Over a vocabulary wider than the top-p candidates: each row keeps exactly the logits at or
    above its floor, the floor's own logit among them (ties kept), and top-p's normaliser in C
    or in torch keeps the same tokens."""
    vocab = 3000
    logits = random_logits(len(batch), seed=seed, vocab=vocab) / 2.0
    args = (
        torch.tensor([vocab if p.top_k < 0 else min(p.top_k, vocab) for p in batch]),
        torch.tensor([p.top_p for p in batch]),
        torch.tensor([p.min_p for p in batch]),
    )
    with pytest.MonkeyPatch.context() as patch:
        if not c_kernel:
            patch.setattr(sampling_filters.cpu_sample, "available", lambda: False)
        elif not cpu_sample.available():
            pytest.skip("no C compiler")
        floors = filter_floors(logits, *args)
        masked = apply_filters(logits, *args)
    if floors is None:
        assert masked is logits
        return
    kept = masked > NEG_INF
    assert torch.equal(kept, logits >= floors)
    assert bool(kept.any(dim=-1).all())  # every row keeps its most likely token at least
    with pytest.MonkeyPatch.context() as patch:  # the other normaliser: the same tokens kept
        if c_kernel:
            patch.setattr(sampling_filters.cpu_sample, "available", lambda: False)
        other = apply_filters(logits, *args) > NEG_INF
    assert torch.equal(other, kept)


def test_one_rows_wide_top_k_does_not_widen_the_batchs_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile tenant's top_k near the vocabulary size: its row finds its k-th alone, the
    batch's `topk` stays at the top-p window (every row sorting its vocabulary would slow every
    tenant's step), and every row keeps what the full sort keeps."""
    vocab = 5000
    logits = random_logits(4, seed=9, vocab=vocab)
    args = (torch.tensor([vocab - 1, 40, vocab, vocab]), torch.tensor([1.0, 0.9, 0.8, 1.0]), torch.zeros(4))
    widths: list[int] = []
    real_topk = torch.Tensor.topk

    def spy(self: torch.Tensor, k: int, *rest: object, **kw: object) -> object:
        widths.append(k)
        return real_topk(self, k, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.Tensor, "topk", spy)
    masked = apply_filters(logits, *args, num_top_p_candidates=64)
    assert widths == [64]
    monkeypatch.undo()
    full = apply_filters(logits, *args, num_top_p_candidates=vocab)
    assert torch.equal(masked, full)
    assert int((masked[0] > NEG_INF).sum()) == vocab - 1  # the wide row's own k kept
