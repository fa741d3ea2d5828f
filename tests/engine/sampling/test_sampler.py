"""Tests of engine/sampling/sampler.py: greedy, filters, penalties, seeds and logprobs."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import weir.engine.sampling.sampler as sampler_module
from tests.engine.sampling_strategies import row_params
from weir.engine.request import SamplingParams
from weir.engine.sampling.sampler import (
    Sampler,
    SampleResult,
    SamplingContext,
    apply_logit_bias,
    apply_penalties,
    make_generator,
)

VOCAB = 64


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """The tensors here are tiny: handing them to a thread pool on a busy machine costs more than
    the work, and made this module ten times slower under load."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def ctx(
    params: SamplingParams, prompt: Sequence[int] = (1, 2, 3), output: Sequence[int] = ()
) -> SamplingContext:
    return SamplingContext(
        params=params,
        prompt_token_ids=list(prompt),
        output_token_ids=list(output),
        generator=make_generator(params.seed, "cpu"),
    )


def random_logits(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3.0


def tokens(results: list[SampleResult]) -> list[int]:
    return [r.token_id for r in results]


def test_greedy_is_argmax_and_top_k_one_equals_greedy() -> None:
    logits = random_logits(4)
    sampler = Sampler(seed=0)
    greedy = tokens(sampler(logits, [ctx(SamplingParams(temperature=0.0)) for _ in range(4)]))
    assert greedy == logits.argmax(-1).tolist()
    top1 = tokens(sampler(logits, [ctx(SamplingParams(temperature=0.8, top_k=1)) for _ in range(4)]))
    assert top1 == greedy


def test_does_not_modify_caller_logits() -> None:
    logits = random_logits(3)
    before = logits.clone()
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.5),
        SamplingParams(temperature=0.7, top_p=0.5, presence_penalty=1.0),
        SamplingParams(temperature=1.0, min_p=0.2),
    ]
    Sampler(seed=0)(logits, [ctx(p, output=(4, 5)) for p in params])
    assert torch.equal(logits, before)


def test_empty_batch_and_shape_mismatch() -> None:
    sampler = Sampler()
    assert sampler(torch.zeros(0, VOCAB), []) == []
    with pytest.raises(ValueError, match="logits"):
        sampler(torch.zeros(2, VOCAB), [ctx(SamplingParams())])


def test_seed_reproduces_independent_of_batch_composition_and_order() -> None:
    target_logits = random_logits(1, seed=7)
    params = SamplingParams(temperature=1.0, seed=1234)

    def run(batch_logits: torch.Tensor, position: int, others: list[SamplingParams]) -> list[int]:
        contexts = [ctx(p) for p in others]
        target = ctx(params)
        contexts.insert(position, target)
        sampler = Sampler()  # an unseeded shared generator: other rows draw differently each run
        out = []
        for _ in range(20):
            out.append(sampler(batch_logits, contexts)[position].token_id)
        return out

    alone = run(target_logits, 0, [])
    all_sampled = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, seed=99),
        SamplingParams(),
    ]
    mixed = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, seed=99, top_p=0.3, top_k=5),
        SamplingParams(temperature=0.0, repetition_penalty=1.2),
    ]
    for others in (all_sampled, mixed):
        for position in (0, 1, 3):
            filler = random_logits(4, seed=position + 100)
            batch = torch.cat([filler[:position], target_logits, filler[position:3]])
            assert run(batch, position, others) == alone
    assert len(set(alone)) > 1  # the seeded row really samples


def test_low_temperature_tends_to_greedy() -> None:
    logits = random_logits(8, seed=3)
    sampler = Sampler(seed=0)
    for temperature in (1e-3, 1e-6, 1e-9):
        out = tokens(sampler(logits, [ctx(SamplingParams(temperature=temperature)) for _ in range(8)]))
        assert out == logits.argmax(-1).tolist()


def test_high_temperature_spreads_samples() -> None:
    logits = random_logits(1, seed=4).expand(200, VOCAB).contiguous()
    out = tokens(Sampler(seed=0)(logits, [ctx(SamplingParams(temperature=5.0)) for _ in range(200)]))
    assert len(set(out)) > 10


def test_sampling_matches_distribution_roughly() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0]])).expand(4000, 4).contiguous()
    out = tokens(Sampler(seed=0)(logits, [ctx(SamplingParams(temperature=1.0)) for _ in range(4000)]))
    freq = [out.count(i) / len(out) for i in range(4)]
    assert freq[3] == 0.0
    assert abs(freq[0] - 0.7) < 0.05 and abs(freq[1] - 0.2) < 0.05 and abs(freq[2] - 0.1) < 0.05


def _allowed(row: torch.Tensor, params: SamplingParams) -> set[int]:
    """Reference filter in float64, lenient at float32 rounding boundaries."""
    x = row.double() / params.temperature
    ids = list(range(x.shape[0]))
    if params.top_k > 0:
        kth = sorted(x.tolist(), reverse=True)[min(params.top_k, len(ids)) - 1]
        ids = [i for i in ids if x[i] >= kth - 1e-6]
    sub = torch.full_like(x, float("-inf"))
    sub[ids] = x[ids]
    p = sub.softmax(-1)
    if params.top_p < 1.0:
        # Token i survives when the mass of tokens strictly more likely than it is below top_p.
        ids = [i for i in ids if float(p[p > p[i] * (1 + 1e-5)].sum()) < params.top_p + 1e-4]
    if params.min_p > 0.0:
        ids = [i for i in ids if float(p[i]) >= params.min_p * float(p.max()) * (1 - 1e-4)]
    return set(ids)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(2, 40),
    batch=st.lists(row_params, min_size=1, max_size=6),
)
def test_filters_never_sample_excluded_tokens(seed: int, vocab: int, batch: list[SamplingParams]) -> None:
    logits = random_logits(len(batch), seed=seed, vocab=vocab)
    allowed = [_allowed(logits[i], p) for i, p in enumerate(batch)]
    sampler = Sampler(seed=seed)
    contexts = [ctx(p) for p in batch]
    for _ in range(8):
        out = tokens(sampler(logits, contexts))
        assert all(t in allowed[i] for i, t in enumerate(out))


def test_top_k_keeps_exactly_k_tokens() -> None:
    logits = torch.arange(10, dtype=torch.float32)[None].expand(500, 10).contiguous()
    out = tokens(
        Sampler(seed=0)(logits, [ctx(SamplingParams(temperature=100.0, top_k=3)) for _ in range(500)])
    )
    assert set(out) == {7, 8, 9}


def test_top_p_keeps_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(500, 4).contiguous()
    out = tokens(
        Sampler(seed=0)(logits, [ctx(SamplingParams(temperature=1.0, top_p=0.75)) for _ in range(500)])
    )
    assert set(out) == {0, 1}  # 0.5 < 0.75 so the second token is needed; 0.8 >= 0.75 stops there


def test_min_p_relative_to_max() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(500, 4).contiguous()
    out = tokens(
        Sampler(seed=0)(logits, [ctx(SamplingParams(temperature=1.0, min_p=0.31)) for _ in range(500)])
    )
    assert set(out) == {0, 1}  # 0.15 < 0.31 * 0.5


def test_repetition_penalty_matches_hand_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0]])
    params = SamplingParams(repetition_penalty=2.0)
    out = apply_penalties(logits, [ctx(params, prompt=(0,), output=(1, 1, 3))])
    assert out.tolist() == [[1.0, -2.0, 0.5, -6.0, 1.0]]


def test_presence_and_frequency_penalties_match_hand_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    # Prompt tokens do not count for OpenAI penalties.
    out = apply_penalties(logits, [ctx(params, prompt=(4, 4), output=(1, 1, 3, 1))])
    expected = [2.0, -1.0 - 0.5 - 3 * 0.25, 0.5, -3.0 - 0.5 - 0.25, 1.0]
    assert out[0].tolist() == pytest.approx(expected)


def test_penalties_batched_rows_are_independent() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [2.0, -1.0, 0.5]])
    contexts = [
        ctx(SamplingParams(repetition_penalty=2.0), prompt=(0,), output=()),
        ctx(SamplingParams(frequency_penalty=1.0), prompt=(0,), output=(2, 2)),
    ]
    out = apply_penalties(logits, contexts)
    assert out.tolist() == [[1.0, -1.0, 0.5], [2.0, -1.0, -1.5]]


def test_greedy_with_penalty_changes_the_choice() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    plain = Sampler()(logits, [ctx(SamplingParams(temperature=0.0), prompt=(5,), output=(0,))])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    penalised = Sampler()(logits, [ctx(params, prompt=(5,), output=(0,))])
    assert plain[0].token_id == 0 and penalised[0].token_id == 1


def test_a_large_positive_logit_bias_forces_the_token_under_greedy() -> None:
    logits = random_logits(2, seed=7)
    worst = int(logits[0].argmin())
    params = SamplingParams(temperature=0.0, logit_bias=((worst, 100.0),))
    results = Sampler()(logits, [ctx(params), ctx(SamplingParams(temperature=0.0))])
    assert results[0].token_id == worst
    assert results[1].token_id == int(logits[1].argmax())  # the other row is untouched


def test_a_minus_100_logit_bias_bans_the_token_greedy_or_sampled() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 8.0  # the model's clear favourite
    greedy = Sampler()(logits, [ctx(SamplingParams(temperature=0.0, logit_bias=((3, -100.0),)))])
    assert greedy[0].token_id != 3
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=1.0, seed=1, logit_bias=((3, -100.0),))
    drawn = {sampler(logits, [ctx(params)])[0].token_id for _ in range(50)}
    assert 3 not in drawn


def test_logit_bias_adds_to_penalised_logits_and_ignores_ids_beyond_the_vocabulary() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    contexts = [ctx(SamplingParams(logit_bias=((1, 5.0), (2, -0.5), (1, 1.0), (99, 3.0))), prompt=(0,))]
    assert apply_logit_bias(logits.clone(), contexts).tolist() == [[2.0, 5.0, 0.0]]
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, logit_bias=((0, 0.5),))
    # The penalty halves token 0 (seen in the prompt) to 1.0, the bias brings it to 1.5: still first.
    assert Sampler()(logits, [ctx(params, prompt=(0,))])[0].token_id == 0


def test_logit_bias_bounds() -> None:
    with pytest.raises(ValueError):
        SamplingParams(logit_bias=((1, 101.0),))
    with pytest.raises(ValueError):
        SamplingParams(logit_bias=tuple((i, 1.0) for i in range(301)))
    with pytest.raises(ValueError):
        SamplingParams(use_beam_search=True, beam_width=2, logit_bias=((1, 1.0),))


def test_logprobs_match_log_softmax_of_raw_logits_and_are_sorted() -> None:
    logits = random_logits(3, seed=5)
    contexts = [
        ctx(SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.3), output=(1, 2)),
        ctx(SamplingParams(temperature=0.7, logprobs=0, seed=3)),
        ctx(SamplingParams(temperature=0.0)),
    ]
    results = Sampler(seed=0)(logits, contexts)
    reference = logits.log_softmax(-1)
    first = results[0].logprob
    assert first is not None
    assert first.token_id == results[0].token_id
    assert first.logprob == pytest.approx(float(reference[0, first.token_id]), abs=1e-6)
    assert len(first.top) == 5
    top_values = [v for _, v in first.top]
    assert top_values == sorted(top_values, reverse=True)
    expected = reference[0].topk(5)
    assert [i for i, _ in first.top] == expected.indices.tolist()
    assert top_values == pytest.approx(expected.values.tolist(), abs=1e-6)
    second = results[1].logprob
    assert second is not None and second.top == ()
    assert second.logprob == pytest.approx(float(reference[1, results[1].token_id]), abs=1e-6)
    assert math.isfinite(second.logprob)
    assert results[2].logprob is None


def test_make_generator() -> None:
    assert make_generator(None, "cpu") is None
    a, b = make_generator(5, "cpu"), make_generator(5, "cpu")
    assert a is not None and b is not None
    assert torch.rand(3, generator=a).tolist() == torch.rand(3, generator=b).tolist()


@pytest.mark.gpu
def test_seeded_sampling_on_cuda_is_batch_independent() -> None:
    device = torch.device("cuda")
    logits = random_logits(4, seed=11).to(device)
    params = SamplingParams(temperature=1.0, seed=42)

    def draw(batch: torch.Tensor, position: int) -> list[int]:
        contexts = [
            SamplingContext(SamplingParams(temperature=1.0), [1], [], None) for _ in range(batch.shape[0])
        ]
        contexts[position] = SamplingContext(params, [1], [], make_generator(42, device))
        sampler = Sampler()
        return [sampler(batch, contexts)[position].token_id for _ in range(10)]

    alone = draw(logits[:1], 0)
    assert draw(torch.cat([logits[1:3], logits[:1]]), 2) == alone


def test_a_prompt_shared_by_rows_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify step's m + 1 rows of one request share its prompt list: the repetition penalty
    counts it once, not once per row (a long prompt would cost every step m + 1 passes)."""
    prompt = list(range(40)) * 25  # 1000 tokens
    base = ctx(SamplingParams(repetition_penalty=1.5), prompt=prompt, output=(7,))
    rows = [replace(base, output_token_ids=[7, *range(i)]) for i in range(5)]
    separate = [ctx(base.params, prompt=prompt, output=r.output_token_ids) for r in rows]
    logits = random_logits(5)
    expected = apply_penalties(logits, separate)
    counted: list[int] = []
    token_counts = sampler_module._token_counts

    def recording(seqs: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
        counted.append(sum(len(s) for s in seqs))
        return token_counts(seqs, vocab_size, device)

    monkeypatch.setattr(sampler_module, "_token_counts", recording)
    assert torch.equal(apply_penalties(logits, rows), expected)
    assert sum(counted) < 2 * len(prompt)


@pytest.mark.parametrize("c_kernel", [True, False])
def test_greedy_rows_take_the_first_largest_logit_with_or_without_the_c_argmax(
    c_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The greedy rows' argmax (the C kernel on float32 CPU logits, torch's elsewhere) answers
    torch.argmax's index: ties go to the first, a large vocabulary's tail included; a sampled row
    in the same batch keeps its own draw."""
    if not c_kernel:
        monkeypatch.setattr(sampler_module.cpu_argmax, "available", lambda: False)
    elif not sampler_module.cpu_argmax.available():
        pytest.skip("no C compiler")
    logits = random_logits(4, seed=3, vocab=49_157)
    logits[1, 17] = logits[1, 40_000] = logits[1].max() + 1.0  # a tie: the first index wins
    logits[2, 49_156] = 1e9  # the last column (the tail past the sixteen lanes)
    greedy = SamplingParams(temperature=0.0)
    contexts = [ctx(greedy), ctx(greedy), ctx(greedy), ctx(SamplingParams(temperature=1.0, seed=5))]
    got = tokens(Sampler()(logits, contexts))
    want = logits.argmax(dim=-1).tolist()
    assert got[:3] == want[:3] and got[1] == 17 and got[2] == 49_156
    alone = ctx(SamplingParams(temperature=1.0, seed=5))  # a fresh generator on the same seed
    assert got[3] == tokens(Sampler()(logits[3:], [alone]))[0]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.7, top_p=0.9, seed=12),
        SamplingParams(temperature=1.3, top_k=40, min_p=0.01, seed=13),
    ],
    ids=["temperature", "top-p", "top-k-min-p"],
)
def test_sampled_rows_draw_the_same_tokens_with_or_without_the_c_kernel(
    params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampled rows' draw (the C kernel on float32 CPU logits, torch's softmax, cumsum and
    search elsewhere) takes the same token from the same seeded uniform number, filters or not,
    over a large vocabulary, with a greedy row and a penalised row in the batch."""
    if not sampler_module.cpu_sample.available():
        pytest.skip("no C compiler")
    logits = random_logits(4, seed=21, vocab=49_157)
    batch = [params, replace(params, seed=(params.seed or 0) + 100), SamplingParams(temperature=0.0)]
    batch.append(replace(params, frequency_penalty=0.5, seed=(params.seed or 0) + 200))

    def draws(steps: int) -> list[list[int]]:
        contexts = [ctx(p, output=(5, 5, 9)) for p in batch]
        sampler = Sampler(seed=0)
        return [tokens(sampler(logits, contexts)) for _ in range(steps)]

    with_c = draws(20)
    monkeypatch.setattr(sampler_module.cpu_sample, "available", lambda: False)
    assert draws(20) == with_c
    assert len({row[0] for row in with_c}) > 1  # they are draws, not one token
