"""Beam search: the algorithm on hand-made log-probabilities, and the engine against transformers.

Semantics are transformers' (`num_beams`, `length_penalty`, `early_stopping`); the engine uses
`early_stopping=False` (the heuristic), the others are checked through `BeamGroups.early_stopping`.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import load_hf_model, make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import InvalidRequestError
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import FinishReason, SamplingParams
from weir.engine.sampling.beam_search import BeamSearch, EarlyStopping

EOS = 0


def _lp(*probs: float) -> list[tuple[int, float]]:
    """Candidates (token i+1 with probability probs[i]), best first."""
    pairs = [(i + 1, math.log(p)) for i, p in enumerate(probs)]
    return sorted(pairs, key=lambda x: -x[1])


def test_first_step_branches_from_the_prompt_only() -> None:
    search = BeamSearch(beam_width=2, max_tokens=5, end_token_ids=[EOS])
    choices = search.step([_lp(0.5, 0.3, 0.2)])
    assert [(c.parent, c.token_id) for c in choices] == [(0, 1), (0, 2)]
    assert [b.token_ids for b in search.live] == [(1,), (2,)]


def test_a_strong_second_beam_takes_both_places() -> None:
    search = BeamSearch(beam_width=2, max_tokens=5, end_token_ids=[EOS])
    search.step([_lp(0.5, 0.4, 0.1)])
    choices = search.step([_lp(0.4, 0.3, 0.3), _lp(0.9, 0.05, 0.05)])
    assert [(c.parent, c.token_id) for c in choices] == [(1, 1), (0, 1)]


def test_an_end_token_among_the_best_finishes_a_hypothesis() -> None:
    search = BeamSearch(beam_width=2, max_tokens=5, end_token_ids=[3])
    search.step([_lp(0.2, 0.3, 0.5)])  # token 3 (the end) is best: it finishes; 2 and 1 live on
    assert [h.token_ids for h in search.finished] == [(3,)] and search.finished[0].ended
    assert [b.token_ids for b in search.live] == [(2,), (1,)]


def test_max_tokens_finishes_every_live_beam_and_ranks_by_length_penalty() -> None:
    search = BeamSearch(beam_width=2, max_tokens=2, end_token_ids=[9], length_penalty=1.0)
    search.step([_lp(0.6, 0.4)])
    assert search.step([_lp(0.5, 0.5), _lp(0.9, 0.1)]) == []
    assert search.done and len(search.best(2)) == 2
    best = search.best(1)[0]
    assert best.token_ids == (2, 1) and not best.ended
    assert best.score == pytest.approx((math.log(0.4) + math.log(0.9)) / 2, rel=1e-6)


def test_early_stopping_true_stops_once_enough_have_finished() -> None:
    search = BeamSearch(beam_width=1, max_tokens=10, end_token_ids=[1], early_stopping=EarlyStopping.ON_FULL)
    search.step([_lp(0.6, 0.4)])
    assert search.done and search.best(1)[0].token_ids == (1,)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        BeamSearch(beam_width=0, max_tokens=3, end_token_ids=[])
    search = BeamSearch(beam_width=2, max_tokens=3, end_token_ids=[])
    with pytest.raises(ValueError):
        search.step([_lp(0.5, 0.5), _lp(0.5, 0.5)])


# -- the engine against transformers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("beam"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def hf(tiny: Path):  # type: ignore[no-untyped-def]
    return load_hf_model(tiny)


def _engine(path: Path, num_blocks: int = 400) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=32, max_model_len=512),
        )
    )


def _run(
    engine: LLMEngine, rid: str, prompt: list[int], params: SamplingParams
) -> dict[int, tuple[list[int], FinishReason | None]]:
    """Run `rid` (and whatever else the engine holds) to the end; `rid`'s choices by index."""
    engine.add_request(EngineRequest(rid, tuple(prompt), params))
    tokens: dict[int, list[int]] = {}
    reasons: dict[int, FinishReason | None] = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id != rid:
                continue
            tokens.setdefault(o.index, []).extend(o.new_token_ids)
            if o.finished:
                reasons[o.index] = o.finish_reason
    return {i: (tokens[i], reasons[i]) for i in tokens}


_EARLY = {EarlyStopping.HEURISTIC: False, EarlyStopping.ON_FULL: True, EarlyStopping.NEVER: "never"}
CASES = [  # prompt length, beam width, length penalty, max tokens, n, early stopping, extra end tokens
    (13, 4, 1.0, 12, 4, EarlyStopping.HEURISTIC, 0),
    (5, 3, -1.0, 8, 2, EarlyStopping.HEURISTIC, 3),
    (30, 2, 0.5, 16, 1, EarlyStopping.HEURISTIC, 2),
    (13, 3, 2.0, 12, 3, EarlyStopping.NEVER, 3),
    (13, 4, 1.0, 20, 2, EarlyStopping.ON_FULL, 3),
    (9, 2, 0.0, 10, 2, EarlyStopping.HEURISTIC, 2),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_beam_search_matches_transformers(tiny: Path, hf, case: int) -> None:  # type: ignore[no-untyped-def]
    plen, width, penalty, max_tokens, n, early, num_end = CASES[case]
    engine = _engine(tiny)
    vocab = engine.model_config.vocab_size
    eos = list(engine.model_config.eos_token_ids)
    rng = random.Random(case)
    prompt = [rng.randrange(3, vocab) for _ in range(plen)]
    # A random model rarely ends a sequence: make a few of its likely tokens end tokens as well.
    greedy = _run(engine, "g", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0][0]
    stop = tuple(sorted(set(greedy[1 : 1 + num_end])))
    engine.beams.early_stopping = early
    params = SamplingParams(
        max_tokens=max_tokens,
        use_beam_search=True,
        beam_width=width,
        length_penalty=penalty,
        n=n,
        stop_token_ids=stop,
    )
    got = _run(engine, "beam", prompt, params)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            num_beams=width,
            num_return_sequences=n,
            length_penalty=penalty,
            early_stopping=_EARLY[early],
            do_sample=False,
            eos_token_id=eos + list(stop),
        )
    for i in range(n):
        row = ref[i, len(prompt) :].tolist()
        ours, reason = got[i]
        assert row[: len(ours)] == ours and all(t == eos[0] for t in row[len(ours) :]), f"choice {i}"
        assert reason is (FinishReason.STOP if ours[-1] in (*eos, *stop) else FinishReason.LENGTH)
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks


def test_beams_share_blocks(tiny: Path) -> None:
    engine = _engine(tiny)
    prompt = list(range(40, 62))  # 5 full blocks of 4 + 2 tokens
    engine.add_request(
        EngineRequest(
            "b", tuple(prompt), SamplingParams(max_tokens=10, use_beam_search=True, beam_width=4, n=2)
        )
    )
    engine.step()  # prefill, then the first choice of beams
    live = engine.beams._groups["b"].beams
    assert len(live) == 4
    tables = [engine.kv.blocks(r.request_id) for r in live]
    assert all(t[:5] == tables[0][:5] for t in tables)  # the prompt's full blocks: one copy for all beams
    assert all(b.ref_cnt == 4 for b in tables[0][:5])
    used = {b.block_id for t in tables for b in t}
    assert len(used) == 6  # 5 shared + the partial block, still shared until a beam writes into it
    while engine.has_unfinished():
        engine.step()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks


def test_beam_search_aborts_and_refuses_what_it_does_not_support(tiny: Path) -> None:
    engine = _engine(tiny)
    params = SamplingParams(max_tokens=10, use_beam_search=True, beam_width=3, n=2)
    engine.add_request(EngineRequest("b", tuple(range(5, 20)), params))
    engine.step()
    outs = engine.abort("b")
    assert [(o.index, o.finish_reason) for o in outs] == [(0, FinishReason.ABORT), (1, FinishReason.ABORT)]
    assert not engine.has_unfinished() and engine.kv.num_free_blocks == engine.kv.num_total_blocks
    for bad, param in (
        (dict(n=4), "n"),
        (dict(stop=("x",)), "stop"),
        (dict(logprobs=2), "logprobs"),
        (dict(beam_width=16, stop_token_ids=(1, 2, 3, 4)), "beam_width"),
    ):
        kwargs = dict(max_tokens=4, use_beam_search=True, beam_width=3) | bad
        with pytest.raises(InvalidRequestError) as info:
            engine.add_request(EngineRequest(f"bad-{param}", (5, 6), SamplingParams(**kwargs)))  # type: ignore[arg-type]
        assert info.value.param == param


def test_beam_search_survives_a_tight_pool(tiny: Path) -> None:
    """Beams preempted for lack of blocks recompute (mostly from the cache) and still finish right.

    The group alone fits the pool (5 shared prompt blocks + 4 beams x 4 own = 21 blocks, issue 21
    item 3); a rival request competing for the same pool forces the preemptions.
    """
    params = SamplingParams(max_tokens=12, use_beam_search=True, beam_width=4, n=2, ignore_eos=True)
    prompt = list(range(60, 81))
    expected = _run(_engine(tiny), "roomy", prompt, params)
    tight = _engine(tiny, num_blocks=22)
    assert tight.num_blocks_per_request == 21
    rival = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    tight.add_request(EngineRequest("rival", tuple(range(100, 140)), rival))
    assert _run(tight, "tight", prompt, params) == expected
    assert tight.scheduler.num_preemptions > 0
    assert tight.kv.num_free_blocks == tight.kv.num_total_blocks


def test_a_beam_search_reports_the_tokens_computed_for_all_its_beams(tiny: Path) -> None:
    # Billing charges what is computed: one token sampled after the prefill, then one per beam per
    # step (no end token here, so every beam runs to max_tokens).
    engine = _engine(tiny)
    for width, n in ((1, 1), (4, 2)):
        params = SamplingParams(max_tokens=8, use_beam_search=True, beam_width=width, n=n, ignore_eos=True)
        engine.add_request(EngineRequest(f"w{width}", tuple(range(5, 20)), params))
        finished = []
        while engine.has_unfinished():
            finished += [o for o in engine.step() if o.finished]
        assert [o.num_output_tokens for o in finished] == [8] * n
        assert [o.num_computed_output_tokens for o in finished] == [1 + 7 * width] * n
