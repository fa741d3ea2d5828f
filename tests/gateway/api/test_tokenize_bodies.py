"""The bodies of `/tokenize` and `/detokenize` (`weir.gateway.api.tokenize_bodies`)."""

from __future__ import annotations

from typing import Any

import pytest

from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.tokenize_bodies import parse_detokenize, parse_tokenize, tokenize_messages
from weir.gateway.http.errors import BadRequestError


def test_prompt_or_messages() -> None:
    body = parse_tokenize({"prompt": "hi", "messages": None}, 8)
    assert body.prompt == "hi" and body.model is None and body.add_special_tokens is None
    chat = parse_tokenize(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False}, 8
    )
    assert [m.role for m in tokenize_messages(chat)] == [Role.USER] and not chat.add_generation_prompt
    assert parse_detokenize({"tokens": [1, 2.0]}, 8).tokens == [1, 2]


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
        ({"prompt": "a", "add_special_tokens": 1}, "add_special_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}] * 9}, "messages"),
        ({"model": "", "prompt": "a"}, "model"),
    ],
)
def test_bad_tokenize_bodies_name_the_field(data: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_tokenize(data, 8)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({}, "tokens"),
        ({"tokens": [-1]}, "tokens[0]"),
        ({"tokens": ["1"]}, "tokens[0]"),
        ({"tokens": [0] * 9}, "tokens"),
    ],
)
def test_bad_detokenize_bodies_name_the_field(data: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_detokenize(data, 8)
    assert info.value.param == param
