"""Incremental detokenization: token ids in, only the new, byte-correct text out.

Decoding every output token alone is wrong (byte-level BPE splits one UTF-8 character over
several tokens; SentencePiece decoders drop a leading space at the start of a sequence) and
decoding the whole output every step is O(n) per token. Instead two offsets into the token list
delimit a small window:

    tokens:  ... [prefix_offset ........ read_offset ........ end)
                  `-- already emitted --' `-- not yet emitted --'

Each step decodes `tokens[prefix_offset:read_offset]` (the prefix text) and `tokens[prefix_offset:]`
and emits the difference. The prefix tokens give the decoder its context (spaces, merges), so the
difference is what the new tokens add. When the decoded window ends in U+FFFD, the last character
is an incomplete UTF-8 sequence: nothing is emitted and the window grows until the character is
complete. Otherwise the window slides: the old read offset becomes the prefix offset. Tokens left
of the prefix offset are dropped, so time and memory per step are O(window), not O(output).

For a byte-level BPE (GPT-2, Llama 3, SmolLM2) the streamed text equals the decoding of all the
output tokens, whatever they are. A byte-fallback decoder (Llama 2, Mistral) turns a whole run of
byte tokens into U+FFFD once any byte in it is invalid, so after an invalid byte it may rewrite
characters already streamed; streaming cannot take text back, and only garbage output differs.

Decoding never applies `clean_up_tokenization_spaces`: that rewrite looks at neighbouring text and
would make the streamed text depend on where the windows fall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

# Prompt tokens kept as left context for the first output tokens (leading-space rules, merges).
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class TokenizerLike(Protocol):
    """The part of a Hugging Face `PreTrainedTokenizerBase` the detokenizer uses."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = ..., **kwargs: Any) -> str: ...


def make_decode_fn(tokenizer: TokenizerLike, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """A function decoding a list of ids without any clean-up of spaces.

    A fast tokenizer's Rust backend is called directly: it gives the same text as
    `tokenizer.decode(..., clean_up_tokenization_spaces=False)` at a third of the cost.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "decode", None)):

        def decode_backend(ids: list[int]) -> str:
            return str(backend.decode(ids, skip_special_tokens=skip_special_tokens))

        return decode_backend

    def decode_python(ids: list[int]) -> str:
        return tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    return decode_python


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, a few tokens at a time.

    The concatenation of everything `push` and `flush` return equals the decoding of the output
    tokens in the context of the prompt. `push` never returns a partial UTF-8 character.
    """

    def __init__(
        self, tokenizer: TokenizerLike, prompt_token_ids: Sequence[int], skip_special_tokens: bool
    ) -> None:
        self._decode = make_decode_fn(tokenizer, skip_special_tokens)
        self._tokens: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        # The window always starts at index 0: tokens left of the prefix offset are deleted.
        self._read_offset = len(self._tokens)
        self._prefix_text: str | None = self._decode(self._tokens)
        if self._prefix_text.endswith(_REPLACEMENT_CHAR):
            # The prompt ends inside a character: as context it would make the first output
            # character's length unknowable, so start without context.
            self._tokens = []
            self._read_offset = 0
            self._prefix_text = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add output tokens; return the text they complete (possibly empty)."""
        if not token_ids:
            return ""
        self._tokens.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever text is still held back (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._tokens[: self._read_offset])
        text = self._decode(self._tokens)
        if len(text) <= len(self._prefix_text) or (text.endswith(_REPLACEMENT_CHAR) and not final):
            # Nothing new yet (special tokens skipped, or a character still incomplete).
            if final:
                self._slide()
            return ""
        new_text = text[len(self._prefix_text) :]
        self._slide()
        return new_text

    def _slide(self) -> None:
        """Make the unread tokens the new prefix and forget the tokens before them."""
        del self._tokens[: self._read_offset]
        self._read_offset = len(self._tokens)
        self._prefix_text = None  # decoded lazily: a window's text depends on its first token
