"""The bodies of `POST /tokenize` and `POST /detokenize`, vLLM's shapes, declared once.

`/tokenize` takes either a `prompt` (text, encoded with the tokenizer's special tokens unless
`add_special_tokens` is false) or chat `messages` (the chat route's message shape, rendered by the
model's chat template with the assistant's turn unless `add_generation_prompt` is false, and then
encoded without special tokens unless `add_special_tokens` is true): exactly what the chat and
completion routes feed the engine. It answers the ids, their count and the model's context length.
`/detokenize` takes token ids and answers their text. `model` may be left out: the served model.

Validation is strict like the generation bodies' (`weir.gateway.api.openai_bodies.requests`); a
`ValidationError` becomes the 400 naming the field (`weir.gateway.api.openai_bodies.params`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from weir.gateway.api.openai_bodies import requests as rb
from weir.gateway.api.openai_bodies.params import bad_request
from weir.gateway.api.openai_bodies.responses import Answer
from weir.gateway.api.protocol import ChatMessage, check_chat_counts, message_of
from weir.gateway.http.errors import BadRequestError


class TokenizeBody(rb.NullIsAbsentBody):
    """A `POST /tokenize` body: `prompt` or `messages`, not both."""

    model: str | None = Field(None, min_length=1, description="Left out: the served model.")
    prompt: str | None = Field(None, description="Text to encode as a completion prompt is.")
    messages: list[rb.ChatMessageBody] | None = Field(
        None, min_length=1, description="A chat to render with the model's template and encode."
    )
    add_special_tokens: bool | None = Field(
        None, description="Default: true for a prompt, false for messages (the template holds them)."
    )
    add_generation_prompt: bool = Field(True, description="With messages: end with the assistant's turn.")


class DetokenizeBody(rb.StrictBody):
    """A `POST /detokenize` body."""

    model: str | None = Field(None, min_length=1, description="Left out: the served model.")
    tokens: list[rb.TokenId] = Field(description="Token ids of the model's vocabulary.")


class TokenizeAnswer(Answer):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeAnswer(Answer):
    prompt: str


def parse_tokenize(data: dict[str, Any], max_messages: int) -> TokenizeBody:
    check_chat_counts(data, max_messages)
    try:
        body = TokenizeBody.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None
    if (body.prompt is None) == (body.messages is None):
        raise BadRequestError("give exactly one of 'prompt' and 'messages'", param="prompt")
    return body


def tokenize_messages(body: TokenizeBody) -> tuple[ChatMessage, ...]:
    return tuple(message_of(m) for m in body.messages or ())


def parse_detokenize(data: dict[str, Any], max_ids: int) -> DetokenizeBody:
    tokens = data.get("tokens")
    if isinstance(tokens, list) and len(tokens) > max_ids:
        raise BadRequestError(
            f"'tokens' may hold at most {max_ids} token ids, got {len(tokens)}",
            param="tokens",
            code="prompt_too_long",
        )
    try:
        return DetokenizeBody.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None
