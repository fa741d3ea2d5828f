"""weir_bench.generators: seeded, replayable synthetic traces."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir_bench.generators import LengthDist, LengthKind, multi_turn, random_lengths, shared_prefix
from weir_bench.workloads import RequestKind, check_trace

OUT = LengthDist(LengthKind.LOGNORMAL, median=32, lo=4, hi=256, sigma=0.8)
WORDS = LengthDist(LengthKind.UNIFORM, median=20, lo=10, hi=40)


def test_random_lengths_is_deterministic_and_bounded() -> None:
    a = random_lengths(50, rate=5.0, prompt_words=WORDS, output_tokens=OUT, tenants=("x", "y"), seed=3)
    b = random_lengths(50, rate=5.0, prompt_words=WORDS, output_tokens=OUT, tenants=("x", "y"), seed=3)
    c = random_lengths(50, rate=5.0, prompt_words=WORDS, output_tokens=OUT, tenants=("x", "y"), seed=4)
    assert a == b and a != c
    assert all(4 <= r.max_tokens <= 256 and 10 <= len(r.messages[0].content.split()) <= 40 for r in a)
    assert [r.t for r in a] == sorted(r.t for r in a)
    assert {r.tenant for r in a} == {"x", "y"}
    comp = random_lengths(3, rate=1.0, prompt_words=WORDS, output_tokens=OUT, kind=RequestKind.COMPLETION)
    assert all(r.prompt and not r.messages for r in comp)


def test_shared_prefix_reuses_a_few_system_prompts_per_tenant() -> None:
    reqs = shared_prefix(
        60,
        rate=10.0,
        num_prefixes=2,
        prefix_words=100,
        suffix_words=WORDS,
        output_tokens=OUT,
        tenants=("a", "b"),
    )
    systems = {(r.tenant, r.messages[0].content) for r in reqs}
    assert len(systems) <= 4 and all(len(s.split()) == 100 for _, s in systems)
    assert len({r.messages[1].content for r in reqs}) > 50  # user turns differ


def test_multi_turn_resends_the_growing_history() -> None:
    reqs = multi_turn(
        3, turns=4, session_rate=2.0, think_time_s=0.5, user_words=WORDS, reply_words=WORDS,
        output_tokens=OUT, system_words=30, seed=1,
    )  # fmt: skip
    check_trace(reqs)  # every `after` points back, in arrival order
    assert len(reqs) == 12
    by_id = {r.id: r for r in reqs}
    for r in reqs:
        turn = int(r.id.rsplit("-", 1)[1])
        assert len(r.messages) == 1 + 2 * turn + 1  # system + (user, assistant) * turn + user
        assert [m.role for m in r.messages[-2:]] == (["assistant", "user"] if turn else ["system", "user"])
        if turn:
            prev = by_id[r.after or ""]
            assert r.messages[: len(prev.messages)] == prev.messages and r.t >= prev.t
        else:
            assert r.after is None


@settings(deadline=None)  # a shared CPU must not fail a correct test on time
@given(
    kind=st.sampled_from(list(LengthKind)),
    lo=st.integers(1, 50),
    span=st.integers(0, 500),
    sigma=st.floats(0.0, 3.0),
    seed=st.integers(0, 2**32),
)
def test_length_dist_stays_in_bounds(kind: LengthKind, lo: int, span: int, sigma: float, seed: int) -> None:
    dist = LengthDist(kind, median=lo + span // 2, lo=lo, hi=lo + span, sigma=sigma)
    rng = random.Random(seed)
    assert all(lo <= dist.sample(rng) <= lo + span for _ in range(20))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="median"):
        LengthDist(LengthKind.FIXED, median=0)
    with pytest.raises(ValueError, match="rate"):
        random_lengths(3, rate=0.0, prompt_words=WORDS, output_tokens=OUT)
    with pytest.raises(ValueError, match="turns"):
        multi_turn(
            1, turns=0, session_rate=1, think_time_s=0, user_words=WORDS, reply_words=WORDS, output_tokens=OUT
        )
