"""Cheap bounds on a prompt's size, checked before any chat template or tokenizer runs.

A prompt's token count is only known once it is tokenized, and tokenizing costs time in
proportion to the text (a 7 MB prompt: 1.2 million tokens, 10 s). But no token covers more than
`chars_per_token` characters (for a byte-level BPE: its longest token, `longest_token_chars`), so a
text of `c` characters holds at least `ceil(c / chars_per_token)` tokens. A prompt whose lower
bound already breaks the model's context, or the whole request's prompt-token bound, is refused
from its length alone (issue 21), in O(number of prompts or messages).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.api.openai_bodies import requests as rb
from gateway.api.protocol import ChatMessage
from gateway.http.errors import BadRequestError

# The fallback when neither the settings nor the tokenizer's vocabulary give a bound.
FALLBACK_CHARS_PER_TOKEN = 128


@dataclass(frozen=True)
class PromptLimits:
    """The size bounds of prompts (from `gateway.server.settings`).

    `max_chat_messages` bounds the messages of a chat, and the content parts across them, before
    any of them is read. `chars_per_token` None: the model's longest token (a sure bound for
    byte-level BPE tokenizers); an operator may set it lower to refuse text that packs more
    characters into a token on average.
    """

    max_chat_messages: int = rb.DEFAULT_MAX_CHAT_MESSAGES
    chars_per_token: int | None = None

    def __post_init__(self) -> None:
        if self.max_chat_messages < 1:
            raise ValueError(f"max_chat_messages must be >= 1, got {self.max_chat_messages}")
        if self.chars_per_token is not None and self.chars_per_token < 1:
            raise ValueError(f"chars_per_token must be >= 1, got {self.chars_per_token}")

    def resolved_chars_per_token(self, max_token_chars: int | None) -> int:
        """`chars_per_token`, else the model's longest token, else the fallback."""
        if self.chars_per_token is not None:
            return self.chars_per_token
        return max_token_chars or FALLBACK_CHARS_PER_TOKEN


def max_request_prompt_tokens(max_model_len: int) -> int:
    """The prompt tokens one request may hold together (all its prompts)."""
    return max(rb.MAX_REQUEST_PROMPT_TOKENS, max_model_len)


def _min_tokens(num_chars: int, chars_per_token: int) -> int:
    return math.ceil(num_chars / chars_per_token)


def _too_long(
    what: str, num_chars: int, chars_per_token: int, max_tokens: int, param: str
) -> BadRequestError:
    return BadRequestError(
        f"{what} {num_chars} characters, so at least {_min_tokens(num_chars, chars_per_token)} tokens "
        f"(no token of this model is longer than {chars_per_token} characters); at most "
        f"{max_tokens} fit",
        param=param,
        code="prompt_too_long",
    )


def check_chat_size(messages: Sequence[ChatMessage], max_model_len: int, chars_per_token: int) -> None:
    """Refuse a chat whose text alone cannot fit the context (the template only adds to it)."""
    num_chars = sum(len(m.content) + len(m.name or "") for m in messages)
    if _min_tokens(num_chars, chars_per_token) >= max_model_len:
        raise _too_long("the messages hold", num_chars, chars_per_token, max_model_len - 1, "messages")


def check_prompt_sizes(
    prompts: Sequence[str | tuple[int, ...]], max_model_len: int, chars_per_token: int
) -> None:
    """Refuse completion prompts that cannot fit, each in the context and all in one request."""
    multiple = len(prompts) > 1
    total = 0
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            num_tokens = _min_tokens(len(prompt), chars_per_token)
            # A prompt of max_model_len tokens leaves no room for even one output token.
            if num_tokens >= max_model_len:
                what = f"prompt[{i}] holds" if multiple else "the prompt holds"
                param = f"prompt[{i}]" if multiple else "prompt"
                raise _too_long(what, len(prompt), chars_per_token, max_model_len - 1, param)
        else:
            num_tokens = len(prompt)
        total += num_tokens
    limit = max_request_prompt_tokens(max_model_len)
    if total > limit:
        raise BadRequestError(
            f"the prompts hold at least {total} tokens together; one request may hold at most {limit}",
            param="prompt",
            code="prompt_too_long",
        )
