"""engine/sampling/token_counts.py: counts kept step by step equal counting the whole sequence again."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from weir.engine.request import SamplingParams
from weir.engine.sampling.sampler import SamplingContext, apply_penalties
from weir.engine.sampling.token_counts import TokenCounts, count_tokens

VOCAB = 50
CPU = torch.device("cpu")
_ids = st.lists(st.integers(0, VOCAB + 5), max_size=40)  # ids past the vocabulary are not counted


def _reference(ids: list[int]) -> torch.Tensor:
    counts = torch.zeros(VOCAB)
    for i in ids:
        if i < VOCAB:
            counts[i] += 1
    return counts


@given(_ids)
def test_count_tokens_counts_each_id_in_the_vocabulary(ids: list[int]) -> None:
    assert torch.equal(count_tokens(ids, VOCAB, CPU), _reference(ids))


@given(_ids, st.lists(st.integers(0, 6), max_size=8))
def test_outputs_counted_as_they_grow_equal_a_full_count(ids: list[int], steps: list[int]) -> None:
    counts = TokenCounts(CPU)
    output: list[int] = []
    for n in steps:  # a step appends n tokens (0: a step the sequence sat out)
        output.extend(ids[len(output) : len(output) + n])
        assert torch.equal(counts.output(output, VOCAB), _reference(output))
    assert torch.equal(counts.output(output[:1], VOCAB), _reference(output[:1]))  # shorter: counted again


def test_the_prompt_is_counted_once_and_a_new_vocabulary_starts_over() -> None:
    counts = TokenCounts(CPU)
    first = counts.prompt([1, 2, 2], VOCAB)
    assert counts.prompt([9, 9], VOCAB) is first  # a sequence's prompt never changes
    assert torch.equal(counts.prompt([1, 2, 2], VOCAB + 1)[:VOCAB], _reference([1, 2, 2]))


@given(st.lists(_ids, min_size=1, max_size=4), st.lists(_ids, min_size=1, max_size=4))
def test_penalties_are_the_same_with_kept_counts(prompts: list[list[int]], outputs: list[list[int]]) -> None:
    rows = min(len(prompts), len(outputs))
    params = SamplingParams(max_tokens=4, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2)
    logits = torch.linspace(-3, 3, rows * VOCAB).reshape(rows, VOCAB)
    plain = [SamplingContext(params, prompts[i], outputs[i], None) for i in range(rows)]
    kept = [
        SamplingContext(params, prompts[i], outputs[i], None, counts=TokenCounts(CPU)) for i in range(rows)
    ]
    for context in kept:  # counted once before, as a running request's are
        assert context.counts is not None
        context.counts.output(context.output_token_ids[:1], VOCAB)
    assert torch.allclose(apply_penalties(logits, plain), apply_penalties(logits, kept))
