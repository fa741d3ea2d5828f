"""OpenAI body parsing: supported fields, unknown fields ignored, wrong types named."""

from __future__ import annotations

from typing import Any

import pytest

from weir.engine.request import Priority, SamplingParams
from weir.gateway.api.protocol import (
    Role,
    check_chat_counts,
    decode_json_object,
    parse_chat_request,
    parse_completion_request,
)
from weir.gateway.http.errors import BadRequestError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> dict[str, Any]:
    return {**CHAT, **fields}


def test_minimal_chat_defaults() -> None:
    req = parse_chat_request(CHAT)
    assert req.model == "m"
    assert req.messages[0].role is Role.USER and req.messages[0].content == "hi"
    o = req.options
    assert (o.max_tokens, o.n, o.logprobs, o.stream) == (None, 1, None, False)
    # Every sampling field the client left out takes the engine's own default.
    assert o.sampling_params(16) == SamplingParams(max_tokens=16)


def test_all_supported_chat_fields() -> None:
    req = parse_chat_request(
        chat(
            max_tokens=5, temperature=0.5, top_p=0.9, n=2, stop="x", seed=3, presence_penalty=0.1,
            frequency_penalty=0.2, logprobs=True, top_logprobs=3, user="u", stream=True,
            stream_options={"include_usage": True}, top_k=4, min_p=0.05, repetition_penalty=1.1,
            ignore_eos=True, priority="batch", logit_bias={"7": -100, "9": 2.5},
        )
    )  # fmt: skip
    o = req.options
    assert o.max_tokens == 5 and o.n == 2
    assert o.logprobs == 3 and o.user == "u" and o.stream and o.include_usage
    assert o.priority is Priority.BATCH
    p = o.sampling_params(5)
    assert p.temperature == 0.5 and p.top_p == 0.9 and p.n == 2 and p.beam_width == 2
    assert p.stop == ("x",) and p.seed == 3 and p.presence_penalty == 0.1 and p.frequency_penalty == 0.2
    assert p.top_k == 4 and p.min_p == 0.05 and p.repetition_penalty == 1.1 and p.ignore_eos
    assert p.logprobs == 3 and p.logit_bias == ((7, -100.0), (9, 2.5))


def test_max_completion_tokens_wins() -> None:
    assert parse_chat_request(chat(max_tokens=5, max_completion_tokens=7)).options.max_tokens == 7


def test_unknown_fields_are_ignored() -> None:
    req = parse_chat_request(chat(frobnicate=True, metadata={"a": 1}, store=False, parallel_tool_calls=None))
    assert req.model == "m"


def test_logprobs_without_top_logprobs_means_sampled_token_only() -> None:
    assert parse_chat_request(chat(logprobs=True)).options.logprobs == 0
    assert parse_chat_request(chat(logprobs=False)).options.logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"n": True}, "n"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"seed": "1"}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"user": 5}, "user"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({"priority": "urgent"}, "priority"),
        ({"priority": 7}, "priority"),
        ({"model": 5}, "model"),
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"5": "1"}}, "logit_bias"),
        ({"logit_bias": {"-5": 1}}, "logit_bias"),
        ({"logit_bias": {"05": 1}}, "logit_bias"),
        ({"logit_bias": {"1e3": 1}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
def test_wrong_chat_fields_name_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_chat_request(chat(**fields))
    assert info.value.param == param
    assert info.value.status_code == 400


def test_missing_required_fields() -> None:
    with pytest.raises(BadRequestError) as info:
        parse_chat_request({"messages": CHAT["messages"]})
    assert info.value.param == "model"
    with pytest.raises(BadRequestError) as info:
        parse_chat_request({"model": "m"})
    assert info.value.param == "messages"


def test_content_parts_and_developer_role() -> None:
    req = parse_chat_request(
        chat(
            messages=[
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ]
        )
    )
    assert req.messages[0].content == "ab"
    assert req.messages[0].to_template() == {"role": "system", "content": "ab"}


def test_integral_floats_are_integers() -> None:
    assert parse_chat_request(chat(max_tokens=5.0)).options.max_tokens == 5


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", ("hello",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: tuple[Any, ...]) -> None:
    assert parse_completion_request({"model": "m", "prompt": prompt}).prompts == expected


@pytest.mark.parametrize("prompt", [[], [[]], [1, "a"], [[1], "a"], 5, {"a": 1}, [True]])
def test_bad_completion_prompts(prompt: Any) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_completion_request({"model": "m", "prompt": prompt})
    assert info.value.param == "prompt"


def test_completion_logprobs_is_an_integer() -> None:
    assert parse_completion_request({"model": "m", "prompt": "x", "logprobs": 2}).options.logprobs == 2
    with pytest.raises(BadRequestError) as info:
        parse_completion_request({"model": "m", "prompt": "x", "logprobs": True})
    assert info.value.param == "logprobs"


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("suffix", "x"), ("best_of", 3)])
def test_unsupported_completion_fields(field: str, value: Any) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_completion_request({"model": "m", "prompt": "x", field: value})
    assert info.value.param == field
    parse_completion_request({"model": "m", "prompt": "x", "echo": False, "best_of": 1})


@pytest.mark.parametrize("body", [b"{", b"", b"\xff", b"[1]", b'"x"', b"null"])
def test_decode_json_object_rejects_non_objects(body: bytes) -> None:
    with pytest.raises(BadRequestError) as info:
        decode_json_object(body)
    assert info.value.code == "invalid_json"


def test_input_item_counts_are_bounded_like_messages() -> None:
    with pytest.raises(BadRequestError) as info:
        check_chat_counts({"input": [{}] * 65}, 64, "input")
    assert info.value.param == "input"
    parts = [{"type": "input_text", "text": ""}] * 40
    with pytest.raises(BadRequestError) as info:
        check_chat_counts(
            {"input": [{"role": "user", "content": parts}, {"role": "user", "content": parts}]}, 64, "input"
        )
    assert (info.value.param, info.value.code) == ("input[1]", "too_many_items")
    outputs = [{"type": "function_call_output", "call_id": "c", "output": parts}] * 2
    with pytest.raises(BadRequestError) as info:
        check_chat_counts({"input": outputs}, 64, "input")
    assert info.value.param == "input[1]"
    check_chat_counts({"input": "x" * 1000}, 1, "input")
