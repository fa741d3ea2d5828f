"""Draft-model speculation through the engine: greedy output token-identical to no speculation with
a perfect draft (the target itself: every draft accepted) and a poor one (another seed), across
batch mixes; sampled requests are reproducible with a seed; an incompatible draft is refused."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_spec_decode_engine import GREEDY, OFF, copy_prompts, engine_for, run, tokens
from tests.engine.tiny_models import make_tiny_model
from weir.engine.output import ScheduledRequest
from weir.engine.request import SamplingParams
from weir.engine.spec_decode.draft_model_drafter import DraftModelDrafter
from weir.engine.spec_decode.factory import DraftModelMismatchError
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("target"), num_kv_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("draft"), num_layers=1, num_kv_heads=1, max_position_embeddings=512, seed=3
    )


def draft_config(path: Path, k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(SpeculativeMethod.DRAFT, k, draft_model_path=str(path), max_verify_tokens=4096)


MIXES = {
    "together": dict(),
    "staggered": dict(arrive_every=2),
    "chunked-prefill": dict(budget=16, arrive_every=1),
    "preemption": dict(num_blocks=40, arrive_every=1),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("which", ["self", "other-seed"])
def test_greedy_identical_to_no_speculation(target: Path, other_seed: Path, mix: str, which: str) -> None:
    options = dict(MIXES[mix])
    arrive_every = int(options.pop("arrive_every", 0))
    prompts = copy_prompts(7, seed=len(mix))
    plain = tokens(run(engine_for(target, OFF, **options), prompts, GREEDY, arrive_every))
    draft = target if which == "self" else other_seed
    engine = engine_for(target, draft_config(draft), **options)
    assert tokens(run(engine, prompts, GREEDY, arrive_every)) == plain
    stats = engine.stats()
    assert stats.num_spec_draft_tokens_total > 0
    if which == "self" and mix != "preemption":
        # The target drafting for itself: every draft is its own greedy choice.
        assert stats.num_spec_accepted_tokens_total == stats.num_spec_draft_tokens_total
    else:
        assert stats.num_spec_accepted_tokens_total <= stats.num_spec_draft_tokens_total


def test_seeded_sampling_reproducible(target: Path, other_seed: Path) -> None:
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)
    prompts = copy_prompts(4, seed=1)
    first = tokens(run(engine_for(target, draft_config(other_seed)), prompts, params))
    again = tokens(run(engine_for(target, draft_config(other_seed)), prompts, params, arrive_every=3))
    assert first == again


def test_a_draft_with_another_vocabulary_is_refused(target: Path, tmp_path: Path) -> None:
    wrong = make_tiny_model(tmp_path / "wrong", vocab_size=300, max_position_embeddings=512)
    with pytest.raises(DraftModelMismatchError, match="vocabulary of 300 tokens"):
        engine_for(target, draft_config(wrong))


def test_a_draft_with_a_shorter_context_is_refused(target: Path, tmp_path: Path) -> None:
    short = make_tiny_model(tmp_path / "short", max_position_embeddings=128)
    with pytest.raises(DraftModelMismatchError, match="context of 128 tokens"):
        engine_for(target, draft_config(short))


def test_a_long_prompt_catches_the_draft_up_in_chunks(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft's first forward of a step feeds at most the scheduler's chunk: a long prompt's draft
    KV is filled over several steps, not in one forward that stalls everyone's step."""
    prompts = [copy_prompts(1, seed=4)[0] + list(range(3, 200)), copy_prompts(2, seed=5)[1]]
    plain = tokens(run(engine_for(target, OFF, budget=16), prompts, GREEDY, arrive_every=4))
    engine = engine_for(target, draft_config(target), budget=16)
    drafter = engine.drafter
    assert isinstance(drafter, DraftModelDrafter)
    prepare = drafter.draft.prepare
    fed: list[int] = []

    def recording(steps: Sequence[ScheduledRequest], inputs: Sequence[Sequence[int]]) -> Any:
        fed.append(sum(s.num_tokens for s in steps))
        return prepare(steps, inputs)

    monkeypatch.setattr(drafter.draft, "prepare", recording)
    assert tokens(run(engine, prompts, GREEDY, arrive_every=4)) == plain
    assert engine.stats().num_spec_draft_tokens_total > 0
    assert max(fed) <= 16
