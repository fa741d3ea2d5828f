"""Closing a tool-call grammar before `max_tokens`: every random walk that the closing matcher
admits ends, within its budget, with a complete array of calls that validates.

A tiny byte-level tokenizer and the xgrammar backend, no model: the matcher's own mask picks
the tokens, as the sampler's would.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tests.engine.tiny_models import make_tiny_tokenizer
from weir.engine.structured.call_closing import (
    ClosableConstraint,
    ClosingAlphabet,
    ClosingConstraint,
    closable,
    new_matcher,
)
from weir.engine.structured.constraints import allowed_tokens
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend

CITY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "country": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    "required": ["name", "country"],
}
CALLS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 8,
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": "plan"},
                    "arguments": {
                        "type": "object",
                        "properties": {
                            "origin": {"$ref": "#/$defs/City"},
                            "stops": {"type": "array", "items": {"$ref": "#/$defs/City"}},
                            "mode": {"enum": ["train", "bus"]},
                            "days": {"type": "integer", "minimum": 3, "maximum": 40},
                        },
                        "required": ["origin", "stops", "mode", "days"],
                    },
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"name": {"const": "ping"}, "arguments": {"type": "object", "properties": {}}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            },
        ]
    },
    "$defs": {"City": CITY},
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("closing_tok")
    make_tiny_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def compiled(tokenizer: Any) -> ClosableConstraint:
    backend = GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    plain = backend.compile(ConstraintSpec.tool_calls(CALLS, "tools"))
    result = closable(plain, ClosingAlphabet.of(tokenizer), ['[{"name": "plan"', '[{"name": "ping"'])
    assert result is not None
    return result


def _walk(
    matcher: ClosingConstraint, tokenizer: Any, rng: random.Random, max_tokens: int
) -> tuple[str, bool]:
    """Random admitted tokens (long ones preferred) until the grammar ends or the budget is spent."""
    ids: list[int] = []
    for _ in range(max_tokens):
        admitted = allowed_tokens([matcher], len(tokenizer), torch.device("cpu"))[0].nonzero()[:, 0].tolist()
        eos = tokenizer.eos_token_id
        choices = [t for t in admitted if t != eos] or admitted
        token = rng.choice(choices)
        matcher.accept(token)
        if token == eos:
            return tokenizer.decode(ids), matcher.is_terminated
        ids.append(token)
    return tokenizer.decode(ids), matcher.is_terminated


def test_the_smallest_budget_is_the_closing_walk_from_the_start(
    compiled: ClosableConstraint, tokenizer: Any
) -> None:
    text, ended = _walk(
        compiled.closing_matcher(compiled.min_tokens), tokenizer, random.Random(0), compiled.min_tokens
    )
    assert ended
    calls = json.loads(text)
    jsonschema.validate(calls, CALLS)
    assert compiled.reserve > compiled.min_tokens > 1  # "plan" costs more than "ping"


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(extra=st.integers(0, 60), seed=st.integers(0, 2**16))
def test_a_random_walk_always_ends_with_complete_calls_within_max_tokens(
    compiled: ClosableConstraint, tokenizer: Any, extra: int, seed: int
) -> None:
    max_tokens = compiled.min_tokens + extra
    matcher = new_matcher(compiled, max_tokens)
    assert isinstance(matcher, ClosingConstraint)
    text, ended = _walk(matcher, tokenizer, random.Random(seed), max_tokens)
    assert ended, f"not closed within {max_tokens} tokens: {text!r}"
    jsonschema.validate(json.loads(text), CALLS)


def test_other_constraints_get_a_plain_matcher(tokenizer: Any) -> None:
    backend = GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    plain = backend.compile(ConstraintSpec.json_schema({"type": "object"}, "response_format"))
    assert not isinstance(new_matcher(plain, 5), ClosingConstraint)
