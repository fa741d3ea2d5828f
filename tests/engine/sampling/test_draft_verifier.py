"""Verification: greedy keeps the longest matching prefix; sampling keeps the target's distribution.

The distribution tests take real logits from a tiny random model with a 32-token vocabulary: the
first token a verify step emits must follow the target's filtered distribution p (chi-square at a
fixed seed), for an n-gram draft (a point mass) and for a draft model's q (another seed of the
model). The same test run with a deliberately wrong acceptance rule (always accept) must fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.tiny_models import load_hf_model, make_tiny_model
from weir.engine.request import SamplingParams
from weir.engine.sampling.draft_verifier import AcceptRule, Draft, Verifier, exact_accept, extended_contexts
from weir.engine.sampling.sampler import Sampler, SamplingContext, make_generator

VOCAB = 32
NUM_TRIALS = 2000
PROMPT = [5, 9, 17, 3, 22, 9, 17]


def _ctx(params: SamplingParams, output: list[int] | None = None, seed: int | None = None) -> SamplingContext:
    return SamplingContext(params, PROMPT, output or [], make_generator(seed, "cpu"))


def chi_square_p_value(counts: list[int], probs: list[float]) -> float:
    """Pearson's chi-square goodness of fit; bins expecting fewer than 5 are pooled.

    The p-value uses the Wilson-Hilferty approximation of the chi-square tail (no scipy needed).
    """
    total = sum(counts)
    observed, expected = [], []
    pooled_o, pooled_e = 0, 0.0
    for c, p in zip(counts, probs, strict=True):
        if p * total >= 5:
            observed.append(c)
            expected.append(p * total)
        else:
            pooled_o += c
            pooled_e += p * total
    if pooled_e > 0 or pooled_o > 0:
        observed.append(pooled_o)
        expected.append(max(pooled_e, 1e-12))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    df = len(observed) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_chi_square_helper_separates_fair_from_loaded_counts() -> None:
    probs = [0.25] * 4
    assert chi_square_p_value([250, 260, 240, 250], probs) > 0.5
    assert chi_square_p_value([400, 200, 200, 200], probs) < 1e-6


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = make_tiny_model(tmp_path_factory.mktemp("target"), vocab_size=VOCAB, initializer_range=0.3)
    return load_hf_model(path)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = make_tiny_model(tmp_path_factory.mktemp("draft"), vocab_size=VOCAB, initializer_range=0.3, seed=1)
    return load_hf_model(path)


@torch.no_grad()
def _next_logits(model: torch.nn.Module, prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits after `prefix` ([vocab]) and after `prefix + [v]` for every v ([vocab, vocab])."""
    ids = torch.tensor([prefix])
    first = model(ids).logits[0, -1]
    batch = torch.tensor([[*prefix, v] for v in range(VOCAB)])
    return first, model(batch).logits[:, -1]


PARAMS = SamplingParams(temperature=0.9, top_k=12, top_p=0.95)


def _first_token_counts(
    target: torch.nn.Module, draft_model: torch.nn.Module | None, accept: AcceptRule
) -> tuple[list[int], list[float]]:
    """Run NUM_TRIALS one-token verify steps; count the first emitted token. Returns (counts, p)."""
    sampler = Sampler(seed=0)
    verifier = Verifier(sampler, accept)
    context = _ctx(PARAMS)
    p0_logits, p1_logits = _next_logits(target, PROMPT)
    p0 = sampler.distribution(p0_logits[None, :], [context])[0]
    if draft_model is not None:
        q_logits, _ = _next_logits(draft_model, PROMPT)
        q0 = sampler.distribution(q_logits[None, :], [context])[0]
    else:
        q0 = None
        # An n-gram draft: a fixed token the target finds plausible but not likeliest.
        point = int(p0.argsort(descending=True)[2])
    draws = torch.Generator().manual_seed(7)
    counts = [0] * VOCAB
    for _ in range(NUM_TRIALS):
        if q0 is not None:
            d = int(torch.multinomial(q0, 1, generator=draws))
            draft = Draft((d,), q0[None, :])
        else:
            d = point
            draft = Draft((d,))
        logits = torch.stack([p0_logits, p1_logits[d]])  # [2, vocab]
        (v,) = verifier.verify(logits, [context], [draft])
        first = v.accepted[0].token_id if v.accepted else v.sampled.token_id
        counts[first] += 1
    return counts, p0.tolist()


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_first_token_follows_the_target_distribution(target, draft_model, drafter: str) -> None:  # type: ignore[no-untyped-def]
    counts, p = _first_token_counts(target, draft_model if drafter == "draft-model" else None, exact_accept)
    assert chi_square_p_value(counts, p) > 1e-3
    assert all(c == 0 for c, q in zip(counts, p, strict=True) if q == 0.0), "a filtered-out token was emitted"


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_always_accepting_fails_the_same_check(target, draft_model, drafter: str) -> None:  # type: ignore[no-untyped-def]
    def always(p: float, q: float, u: float) -> bool:
        return True

    counts, p = _first_token_counts(target, draft_model if drafter == "draft-model" else None, always)
    assert chi_square_p_value(counts, p) < 1e-6


def test_greedy_accepts_the_longest_matching_prefix() -> None:
    params = SamplingParams(temperature=0.0)
    logits = torch.full((4, VOCAB), -5.0)
    for row, best in enumerate([7, 8, 3, 11]):
        logits[row, best] = 5.0
    verifier = Verifier(Sampler(seed=0))
    (all_in,) = verifier.verify(logits, [_ctx(params)], [Draft((7, 8, 3))])
    assert [s.token_id for s in all_in.accepted] == [7, 8, 3] and all_in.sampled.token_id == 11
    (cut,) = verifier.verify(logits, [_ctx(params)], [Draft((7, 9, 3))])
    assert [s.token_id for s in cut.accepted] == [7] and cut.sampled.token_id == 8
    (none,) = verifier.verify(logits, [_ctx(params)], [Draft((1, 8, 3))])
    assert none.accepted == () and none.sampled.token_id == 7


def test_penalties_see_the_drafts_before_each_row() -> None:
    # Row 1 prefers token 4 by a hair; a repetition penalty over the output (which, at row 1,
    # holds the draft token 4) makes token 6 the greedy choice, exactly as decoding one by one.
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    logits = torch.zeros(2, VOCAB)
    logits[0, 4] = 3.0
    logits[1, 4], logits[1, 6] = 2.0, 1.5
    sampler = Sampler(seed=0)
    (v,) = Verifier(sampler).verify(logits, [_ctx(params)], [Draft((4,))])
    assert [s.token_id for s in v.accepted] == [4]
    one_by_one = sampler(logits[1:2], [extended_contexts(_ctx(params), [4])[1]])[0].token_id
    assert v.sampled.token_id == one_by_one == 6


def test_logprobs_are_the_model_logprobs_of_each_row() -> None:
    params = SamplingParams(temperature=0.0, logprobs=2)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(dim=-1).tolist()
    (v,) = Verifier(Sampler(seed=0)).verify(logits, [_ctx(params)], [Draft((best[0], best[1]))])
    emitted = [*v.accepted, v.sampled]
    want = logits.log_softmax(dim=-1)
    for row, sample in enumerate(emitted):
        assert sample.logprob is not None
        assert sample.logprob.logprob == pytest.approx(float(want[row, sample.token_id]), abs=1e-6)
        assert len(sample.logprob.top) == 2


def test_seeded_verification_repeats() -> None:
    params = SamplingParams(temperature=1.0, seed=99)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    runs = []
    for _ in range(2):
        verifier = Verifier(Sampler())  # an OS-seeded shared generator: seeded rows must not use it
        results = [verifier.verify(logits, [_ctx(params, seed=99)], [Draft((1, 2, 3))])[0] for _ in range(1)]
        runs.append([(tuple(a.token_id for a in r.accepted), r.sampled.token_id) for r in results])
    assert runs[0] == runs[1]


def test_mismatched_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="logit rows"):
        Verifier(Sampler(seed=0)).verify(torch.zeros(2, VOCAB), [_ctx(SamplingParams())], [Draft((1, 2))])
    with pytest.raises(ValueError, match="q rows"):
        Draft((1, 2), torch.zeros(1, VOCAB))
