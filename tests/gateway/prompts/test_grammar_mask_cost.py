"""A search for regexes the gateway accepts but whose masks are slow (issue 54).

The gateway's bounds on a regex (gateway/prompts/grammar.py: repetitions stacked at most two deep,
their counts multiplying to at most 4,096) are what keep one tenant's grammar from costing every
tenant's step; the mask workers' time limit (`MaskConfig.timeout_s`) is the net under them. Here
hypothesis builds regexes from the constructs whose cost multiplies (nested and counted
repetitions, optional items, alternatives, classes), keeps those `check_limits` accepts, compiles
them against the real SmolLM2 tokenizer and walks each grammar a few tokens, computing every
mask on a worker as the engine does. The behaviour checked is the product's contract: a grammar
the gateway accepts never fails its request by running past the mask time limit. A regex that
does is a finding: tighten the bounds, do not raise the limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from weir.engine.config import MaskConfig
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend
from weir.gateway.http.errors import BadRequestError
from weir.gateway.prompts.grammar import GrammarLimits, check_limits

MASK_LIMIT_S = MaskConfig().timeout_s
COMPILE_LIMIT_S = 5.0  # the gateway's default --grammar-compile-timeout-s: slower compiles are refused
STEPS = 6  # masks computed per grammar, along one random walk
T = TypeVar("T")

_atoms = st.sampled_from(["a", "ab", "[a-z]", "[ab]", r"\d", ".", " ", "(a|aa)", "(a|b|ab)", "x?"])
_quantifiers = st.sampled_from(
    ["", "*", "+", "?", "{0,8}", "{1,16}", "{0,64}", "{2,256}", "{16}", "{0,4096}"]
)


def _regexes() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        group = st.tuples(inner, _quantifiers).map(lambda t: f"({t[0]}){t[1]}")
        alternation = st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")")
        sequence = st.lists(inner, min_size=2, max_size=3).map("".join)
        return group | alternation | sequence

    leaf = st.tuples(_atoms, _quantifiers).map("".join)
    return st.recursive(leaf, extend, max_leaves=6)


@pytest.fixture(scope="module")
def backend(default_model_dir: Path) -> GrammarBackend:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    return GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def _bounded(fn: Callable[[], T], limit_s: float) -> T:
    """`fn()` on a thread of its own, waited for at most `limit_s` (FutureTimeout past it; the
    thread is left to finish, as the gateway's and the engine's workers are)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="mask-cost-search")
    try:
        return pool.submit(fn).result(timeout=limit_s)
    finally:
        pool.shutdown(wait=False)


def _allowed(mask: torch.Tensor, vocab: int) -> list[int]:
    words = mask[0].to(torch.int64) & 0xFFFFFFFF
    bits = (words.unsqueeze(1) >> torch.arange(32)) & 1
    ids = torch.nonzero(bits.flatten()).flatten()
    return [int(i) for i in ids if i < vocab]


def _accepted(pattern: str) -> bool:
    try:
        check_limits(ConstraintSpec.regex(pattern, "structured_outputs.regex"), GrammarLimits())
    except BadRequestError:
        return False
    return True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=_regexes(), seed=st.integers(0, 2**16))
def test_no_regex_the_gateway_accepts_has_masks_past_the_time_limit(
    backend: GrammarBackend, pattern: str, seed: int
) -> None:
    accepted = _accepted(pattern)
    event("accepted by the gateway" if accepted else "refused: grammar_too_complex")
    if not accepted:
        return  # refused with 400 grammar_too_complex: never reaches a worker
    spec = ConstraintSpec.regex(pattern, "structured_outputs.regex")
    try:
        compiled = _bounded(lambda: backend.compile(spec), COMPILE_LIMIT_S)
    except FutureTimeout:
        return  # the gateway refuses it with 400 grammar_compile_timeout, on its own compile workers
    except Exception:  # noqa: BLE001 - a regex xgrammar cannot compile is refused with 400 invalid_grammar
        return
    matcher: Any = compiled.matcher()
    rng = random.Random(seed)
    vocab = backend.vocab_size
    for step in range(STEPS):
        if matcher.is_terminated:
            break
        try:
            mask = _bounded(matcher._compute_mask, MASK_LIMIT_S)
        except FutureTimeout:
            pytest.fail(
                f"{pattern!r} is accepted by the gateway's bounds, but its mask at step {step} ran past "
                f"the {MASK_LIMIT_S:g} s limit that fails a request"
            )
        allowed = _allowed(mask, vocab)
        if not allowed:
            break
        matcher.accept(rng.choice(allowed))
