"""Cheap bounds on a prompt's size, checked before any chat template or tokenizer runs.

A prompt's token count is only known once it is tokenized, and tokenizing costs time in
proportion to the text (a 7 MB prompt: 1.2 million tokens, 10 s). But no token covers more than
`chars_per_token` characters (for a byte-level BPE: its longest token, `longest_token_chars`), so a
text of `c` characters holds at least `ceil(c / chars_per_token)` tokens. A prompt whose lower
bound already breaks the model's context, or the whole request's prompt-token bound, is refused
from its length alone (issue 21), in O(number of prompts or messages).

The same cheap sizes decide where a prompt is tokenized: `chat_bytes` and `prompts_bytes` give
the UTF-8 bytes a template and tokenizer will read (their cost grows with it), and a prompt of at
most `TokenizerPool.inline_max_bytes` is tokenized on the event loop rather than a worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from weir.gateway.api.openai_bodies import requests as rb
from weir.gateway.api.protocol import ChatMessage
from weir.gateway.http.errors import BadRequestError
from weir.gateway.settings.settings_prompts import DEFAULT_MAX_CHAT_MESSAGES

# The fallback when neither the settings nor the tokenizer's vocabulary give a bound.
FALLBACK_CHARS_PER_TOKEN = 128

# A chat of more messages, or a completion of more prompts, than this goes to a worker whatever
# its size: a template loops over the messages (16 one-word messages: ~0.11 ms of SmolLM2's
# template, measured) and each prompt is one more tokenizer call.
INLINE_MAX_ITEMS = 8


@dataclass(frozen=True)
class PromptLimits:
    """The size bounds of prompts (from `weir.gateway.settings.settings`).

    `max_chat_messages` bounds the messages of a chat, and the content parts across them, before
    any of them is read. `chars_per_token` None: the model's longest token (a sure bound for
    byte-level BPE tokenizers); an operator may set it lower to refuse text that packs more
    characters into a token on average.
    """

    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES
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


def _utf8_len(text: str, limit: int) -> int:
    """`text`'s UTF-8 bytes, or just its length once that alone passes `limit` (never less)."""
    if text.isascii() or len(text) > limit:  # isascii is O(1) on CPython's str
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def chat_bytes(messages: Sequence[ChatMessage], limit: int) -> int:
    """The UTF-8 bytes of a chat's text, exact up to `limit`; above it, any number above `limit`.

    A chat of more than `INLINE_MAX_ITEMS` messages, or with an assistant's earlier tool calls
    (rendered into its content first), counts as above `limit`.
    """
    return _total_up_to((_message_bytes(m, limit) for m in messages), len(messages), limit)


def prompts_bytes(prompts: Sequence[str | tuple[int, ...]], limit: int) -> int:
    """The UTF-8 bytes of completion prompts, a token id counting as one; exact up to `limit`.

    More than `INLINE_MAX_ITEMS` prompts count as above `limit`.
    """
    sizes = (_utf8_len(p, limit) if isinstance(p, str) else len(p) for p in prompts)
    return _total_up_to(sizes, len(prompts), limit)


def _message_bytes(message: ChatMessage, limit: int) -> int:
    if message.tool_calls:
        return limit + 1
    return sum(
        _utf8_len(text, limit) for text in (message.content, message.name or "", message.tool_call_id or "")
    )


def _total_up_to(sizes: Iterable[int], num_items: int, limit: int) -> int:
    """The sum of `sizes`, stopped once past `limit`; above it when there are too many items."""
    if num_items > INLINE_MAX_ITEMS:
        return limit + 1
    total = 0
    for size in sizes:
        total += size
        if total > limit:
            break
    return total
