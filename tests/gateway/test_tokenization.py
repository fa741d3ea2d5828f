"""Prompt building: the chat template, the completion prompt forms, token names for logprobs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import BadRequestError, UnprocessableError
from gateway.protocol import ChatMessage, Role
from gateway.tokenization import INLINE_TOKENIZE_CHARS, PromptBuilder
from tests.gateway.harness import tokenizer
from tests.gateway.tiny_tokenizer import word_token_id


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder(tokenizer())


def test_chat_template_with_generation_prompt(builder: PromptBuilder) -> None:
    text = builder.render_chat([ChatMessage(Role.SYSTEM, "you are helpful"), ChatMessage(Role.USER, "hello")])
    assert text == (
        "<|im_start|>system\nyou are helpful<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_ids_do_not_add_special_tokens_twice(builder: PromptBuilder) -> None:
    ids = builder.encode_chat([ChatMessage(Role.USER, "hello world")])
    tok = tokenizer()
    assert list(ids) == tok.encode(
        builder.render_chat([ChatMessage(Role.USER, "hello world")]), add_special_tokens=False
    )
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2


def test_template_errors_are_422s() -> None:
    class Broken:
        def apply_chat_template(self, conversation: object, **kwargs: object) -> str:
            raise ValueError("roles must alternate")

        def __len__(self) -> int:
            return 10

    with pytest.raises(UnprocessableError) as info:
        PromptBuilder(Broken()).render_chat([ChatMessage(Role.USER, "x")])  # type: ignore[arg-type]
    assert info.value.param == "messages" and "alternate" in info.value.message
    assert info.value.status_code == 422


def test_completion_prompt_text_and_ids(builder: PromptBuilder) -> None:
    assert builder.encode_prompt("hello world") == (24, 25)
    assert builder.encode_prompt((1, 2, 3)) == (1, 2, 3)


def test_token_ids_outside_the_vocabulary(builder: PromptBuilder) -> None:
    with pytest.raises(BadRequestError) as info:
        builder.encode_prompt((1, builder.vocab_size))
    assert info.value.param == "prompt"
    with pytest.raises(BadRequestError) as info:
        asyncio.run(builder.encode_prompts_async([(1,), (-1,)]))
    assert info.value.param == "prompt[1]"


def test_long_prompts_are_encoded_off_the_loop_with_the_same_result(builder: PromptBuilder) -> None:
    long_text = "hello " * (INLINE_TOKENIZE_CHARS // 5)
    ids = asyncio.run(builder.encode_prompts_async([long_text, "world"]))
    assert ids == (builder.encode_prompt(long_text), builder.encode_prompt("world"))
    chat = asyncio.run(builder.encode_chat_async([ChatMessage(Role.USER, long_text)]))
    assert chat == builder.encode_chat([ChatMessage(Role.USER, long_text)])


def test_token_text_is_cached(builder: PromptBuilder) -> None:
    assert builder.token_text(word_token_id("gamma")) == "gamma"
    assert builder.token_text(word_token_id("gamma")) == "gamma"
