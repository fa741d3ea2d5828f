"""weir_bench.costly_floods: every issue-54 flood is a request the gateway's own parser accepts, at the
bound of its field (300 biases, 16 stop strings of 512 characters, top_logprobs 20), and a regex
flood compiles anew each request (a fresh literal defeats the grammar cache)."""

from __future__ import annotations

import json
import math
import re

import pytest

from weir.engine.sampling_bounds import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)
from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api.protocol import parse_chat_request
from weir.gateway.http.errors import BadRequestError
from weir.gateway.prompts.grammar import GrammarLimits, check_limits
from weir_bench.costly_floods import COSTLY_FLOODS, COSTLY_PROBES, REGEX_BOUNDED, REGEX_NESTED_256
from weir_bench.hostile import Target

TARGET = Target("http://127.0.0.1:1", "smol", "sk-weir-attacker", 4096)
PROBES = {p.name: p for p in COSTLY_PROBES}


def _body(name: str) -> dict:
    path, headers, raw = PROBES[name].build(TARGET)
    assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer sk-weir-attacker"
    return json.loads(raw)


def _repetition_product(pattern: str) -> int:
    """The product of the upper counts of the nested `{m,n}` repetitions (every one nests here)."""
    return math.prod(int(n) for n in re.findall(r"\{\d+,(\d+)\}", pattern))


def check_limits_admits(pattern: str) -> bool:
    try:
        check_limits(ConstraintSpec.regex(pattern, "structured_outputs.regex"), GrammarLimits())
    except BadRequestError:
        return False
    return True


def test_every_flood_names_probes_that_exist() -> None:
    assert set(COSTLY_FLOODS) == {"regex", "logit-bias", "stop", "logprobs", "plain"}
    assert {name for names in COSTLY_FLOODS.values() for name in names} == set(PROBES)


def test_the_plain_control_is_the_same_chat_with_no_costly_field() -> None:
    body = _body("plain_chat")
    assert set(body) == {"model", "messages", "max_tokens", "ignore_eos"}
    assert body["max_tokens"] == 32 and body["ignore_eos"] is True


@pytest.mark.parametrize("name", sorted(PROBES))
def test_each_body_passes_the_gateways_request_validation(name: str) -> None:
    request = parse_chat_request(_body(name))
    assert request.model == "smol" and request.options.max_tokens == 32


def test_the_regex_flood_sends_both_patterns_each_behind_a_fresh_literal() -> None:
    assert _repetition_product(REGEX_NESTED_256) == 256**4
    assert check_limits_admits(REGEX_BOUNDED) and not check_limits_admits(REGEX_NESTED_256)
    for name, pattern in [
        ("regex_nested_256", REGEX_NESTED_256),
        ("regex_admitted_ambiguous", REGEX_BOUNDED),
    ]:
        sent = [_body(name)["structured_outputs"]["regex"] for _ in range(5)]
        assert all(s.endswith(pattern) and re.fullmatch(r"q[a-z]{8}", s[: -len(pattern)]) for s in sent)
        assert len(set(sent)) == 5  # no two alike: the grammar cache never answers one


def test_the_sampling_floods_sit_at_their_fields_bounds() -> None:
    bias = _body("logit_bias_300")["logit_bias"]
    assert len(bias) == MAX_LOGIT_BIAS == 300 and {abs(v) for v in bias.values()} == {100.0}
    stop = _body(f"stop_{MAX_STOP_STRINGS}x{MAX_STOP_CHARS}")["stop"]
    assert len(stop) == MAX_STOP_STRINGS and {len(s) for s in stop} == {MAX_STOP_CHARS}
    logprobs = _body(f"top_logprobs_{MAX_LOGPROBS}")
    assert logprobs["logprobs"] is True and logprobs["top_logprobs"] == MAX_LOGPROBS
