"""Turning OpenAI prompts into token ids, and token ids into the strings logprobs report.

Chat prompts go through the model's own chat template (`apply_chat_template` with
`add_generation_prompt=True`), rendered to text and then encoded without adding special tokens
again, since the template already holds them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import anyio.to_thread

from gateway.errors import BadRequestError, UnprocessableError
from gateway.protocol import ChatMessage

# Prompts longer than this many characters are tokenized on a worker thread, so a huge prompt
# does not stall every other stream on the event loop; short ones are cheaper to do inline.
INLINE_TOKENIZE_CHARS = 4096


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the gateway uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str: ...

    def __len__(self) -> int: ...


class PromptBuilder:
    """Renders and tokenizes prompts for one model, and names tokens for logprobs."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self._tokenizer = tokenizer
        # A fast tokenizer's Rust object is not safe to share between threads ("Already borrowed"
        # when one thread changes truncation/padding while another encodes); the event loop and the
        # worker threads that tokenize long prompts take turns. The engine thread has its own copy.
        self._lock = threading.Lock()
        self.vocab_size = vocab_size if vocab_size is not None else len(tokenizer)
        # Bounded by the vocabulary, so a plain dict is enough.
        self._token_text: dict[int, str] = {}

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The chat template applied to `messages`, ending with the assistant's turn."""
        try:
            with self._lock:
                text = self._tokenizer.apply_chat_template(
                    [m.to_template() for m in messages], tokenize=False, add_generation_prompt=True
                )
        except Exception as exc:  # the template is the model's Jinja code: any error is the caller's input
            raise UnprocessableError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from None
        if not isinstance(text, str):
            raise UnprocessableError("the chat template did not produce text", param="messages")
        return text

    def encode_chat(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """Token ids of the rendered chat prompt."""
        text = self.render_chat(messages)
        with self._lock:
            ids = self._tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise UnprocessableError("the messages produced an empty prompt", param="messages")
        return tuple(ids)

    def encode_prompt(self, prompt: str | tuple[int, ...], param: str = "prompt") -> tuple[int, ...]:
        """A completion prompt: text is encoded (with the model's special tokens); ids are checked."""
        if isinstance(prompt, str):
            with self._lock:
                ids = tuple(self._tokenizer.encode(prompt, add_special_tokens=True))
            if not ids:
                raise BadRequestError("the prompt is empty", param=param)
            return ids
        for token_id in prompt:
            if not 0 <= token_id < self.vocab_size:
                raise BadRequestError(
                    f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})", param=param
                )
        return prompt

    async def encode_chat_async(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """`encode_chat`, on a worker thread when the conversation is long."""
        if sum(len(m.content) for m in messages) <= INLINE_TOKENIZE_CHARS:
            return self.encode_chat(messages)
        return await anyio.to_thread.run_sync(self.encode_chat, messages)

    async def encode_prompts_async(
        self, prompts: Sequence[str | tuple[int, ...]]
    ) -> tuple[tuple[int, ...], ...]:
        """`encode_prompt` for each prompt, on a worker thread when the text is long."""
        num_chars = sum(len(p) for p in prompts if isinstance(p, str))
        if num_chars <= INLINE_TOKENIZE_CHARS:
            return self._encode_all(prompts)
        return await anyio.to_thread.run_sync(self._encode_all, prompts)

    def _encode_all(self, prompts: Sequence[str | tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
        multiple = len(prompts) > 1
        return tuple(
            self.encode_prompt(p, f"prompt[{i}]" if multiple else "prompt") for i, p in enumerate(prompts)
        )

    def token_text(self, token_id: int) -> str:
        """The text of one token as logprobs report it (undecodable byte pieces show as U+FFFD)."""
        text = self._token_text.get(token_id)
        if text is None:
            with self._lock:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text
