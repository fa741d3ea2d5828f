"""Turning OpenAI prompts into token ids, and token ids into the strings logprobs report.

Chat prompts go through the model's own chat template (`apply_chat_template` with
`add_generation_prompt=True`), rendered to text and then encoded without adding special tokens
again, since the template already holds them.

The async methods, which the routes use, run on a `TokenizerPool` worker with a tokenizer copy
of their own: no template, tokenizer or token-id scan of a long prompt runs on the event loop, and
a long prompt on one worker does not hold a lock that every other prompt needs (issue 21). A
prompt of at most the pool's `inline_max_bytes` is tokenized on the calling thread with the
loop's own copy (made with the workers' by `make_copies`), which no worker ever holds; it waits
for no worker either, since the hand-off costs more than the work. The sync methods share the one
tokenizer under a lock (tests, logprob token names).
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from weir.gateway.api.protocol import ChatMessage
from weir.gateway.http.errors import BadRequestError, UnprocessableError
from weir.gateway.prompts.prompt_limits import chat_bytes, prompts_bytes
from weir.gateway.prompts.tokenizer_pool import TokenizerPool

T = TypeVar("T")

# Workers of the pool a builder uses when its caller passes none (tests, tools).
DEFAULT_POOL_WORKERS = 2


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the gateway uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str: ...

    def __len__(self) -> int: ...


def longest_token_chars(tokenizer: Tokenizer) -> int | None:
    """The length of the vocabulary's longest token string, None when the tokenizer has no vocabulary.

    For a byte-level BPE a token string holds one character per byte, so no token covers more
    characters of a text than this: a text of more than `n` times this many characters has more
    than `n` tokens, whatever it says.
    """
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    try:
        vocab = get_vocab()
        return max((len(t) for t in vocab), default=None)
    except Exception:  # a tokenizer that cannot list its vocabulary: the settings' bound applies
        return None


class PromptBuilder:
    """Renders and tokenizes prompts for one model, and names tokens for logprobs."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self._tokenizer = tokenizer
        # A fast tokenizer's Rust object is not safe to share between threads ("Already borrowed"
        # when one thread changes truncation/padding while another encodes): users of the shared
        # one take turns, and each pool worker takes a copy of its own (`_copies`). The engine
        # thread has its own copy.
        self._lock = threading.Lock()
        self._copies: list[Tokenizer] = []  # idle private copies
        self.num_copies = 0  # private copies made, idle or in use
        self._copies_lock = threading.Lock()
        # The calling thread's copy for short prompts (`_tokenize`); its lock is only contended
        # when two event loops share this builder (tests), and then only for one short prompt.
        self._inline_copy: Tokenizer | None = None
        self._inline_lock = threading.Lock()
        self._copyable = True
        self._default_pool: TokenizerPool | None = None
        self.vocab_size = vocab_size if vocab_size is not None else len(tokenizer)
        self.max_token_chars = longest_token_chars(tokenizer)
        # Bounded by the vocabulary, so a plain dict is enough.
        self._token_text: dict[int, str] = {}

    # -- on the calling thread, over the shared tokenizer ---------------------------------------

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The chat template applied to `messages`, ending with the assistant's turn."""
        with self._lock:
            return _render_chat(self._tokenizer, messages)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """Token ids of the rendered chat prompt."""
        with self._lock:
            return _encode_chat(self._tokenizer, messages)

    def encode_prompt(self, prompt: str | tuple[int, ...], param: str = "prompt") -> tuple[int, ...]:
        """A completion prompt: text is encoded (with the model's special tokens); ids are checked."""
        if isinstance(prompt, str):
            with self._lock:
                return _encode_text(self._tokenizer, prompt, param)
        return self._check_ids(prompt, param)

    def token_text(self, token_id: int) -> str:
        """The text of one token as logprobs report it (undecodable byte pieces show as U+FFFD)."""
        text = self._token_text.get(token_id)
        if text is None:
            with self._lock:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    # -- on a pool worker, or on the loop when short ----------------------------------------------

    async def encode_chat_async(
        self, messages: Sequence[ChatMessage], pool: TokenizerPool | None = None, tenant_id: str = ""
    ) -> tuple[int, ...]:
        """`encode_chat`, on a worker of `pool` (a share of it per `tenant_id`), or here when short."""
        return await self._tokenize(pool, tenant_id, chat_bytes, _encode_chat, messages)

    async def tokenize_chat_async(
        self,
        messages: Sequence[ChatMessage],
        pool: TokenizerPool | None = None,
        tenant_id: str = "",
        *,
        generation_prompt: bool = True,
        add_special_tokens: bool = False,
    ) -> tuple[int, ...]:
        """`POST /tokenize` of messages: the chat template, with or without the assistant's turn, and
        the tokenizer's special tokens added or not (the defaults: what the chat route encodes)."""
        fn = functools.partial(
            _encode_chat, generation_prompt=generation_prompt, add_special_tokens=add_special_tokens
        )
        return await self._tokenize(pool, tenant_id, chat_bytes, fn, messages)

    async def tokenize_text_async(
        self,
        text: str,
        pool: TokenizerPool | None = None,
        tenant_id: str = "",
        add_special_tokens: bool = True,
    ) -> tuple[int, ...]:
        """`POST /tokenize` of a prompt: its token ids (possibly none), within `tenant_id`'s share."""
        fn = functools.partial(_encode_plain, add_special_tokens=add_special_tokens)
        return await self._tokenize(pool, tenant_id, _text_bytes, fn, text)

    async def decode_async(
        self, token_ids: Sequence[int], pool: TokenizerPool | None = None, tenant_id: str = ""
    ) -> str:
        """`POST /detokenize`: the text of `token_ids` (ids checked against the vocabulary first)."""
        ids = self._check_ids(tuple(token_ids), "tokens")
        return await self._tokenize(pool, tenant_id, _ids_bytes, _decode, ids)

    async def encode_prompts_async(
        self,
        prompts: Sequence[str | tuple[int, ...]],
        pool: TokenizerPool | None = None,
        tenant_id: str = "",
    ) -> tuple[tuple[int, ...], ...]:
        """`encode_prompt` for each prompt, on a worker of `pool` (a share of it per `tenant_id`), or
        here when short."""
        return await self._tokenize(pool, tenant_id, prompts_bytes, self._encode_all, prompts)

    async def encode_chat_prefix_async(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """Token ids of `messages` rendered as the start of a chat, without the assistant's turn
        (a shared prefix that chat prompts begin with), on a worker of the default pool."""
        return await self._pool(None).run("", self._with_private, _encode_chat, messages, False)

    async def encode_text_async(self, text: str, add_special_tokens: bool = True) -> tuple[int, ...]:
        """Token ids of `text`, on a worker of the default pool."""
        return await self._pool(None).run("", self._with_private, _encode_plain, text, add_special_tokens)

    def _pool(self, pool: TokenizerPool | None) -> TokenizerPool:
        if pool is not None:
            return pool
        if self._default_pool is None:
            self._default_pool = TokenizerPool(DEFAULT_POOL_WORKERS, 1.0)
        return self._default_pool

    def _encode_all(
        self, tokenizer: Tokenizer, prompts: Sequence[str | tuple[int, ...]]
    ) -> tuple[tuple[int, ...], ...]:
        multiple = len(prompts) > 1
        out = []
        for i, p in enumerate(prompts):
            param = f"prompt[{i}]" if multiple else "prompt"
            out.append(_encode_text(tokenizer, p, param) if isinstance(p, str) else self._check_ids(p, param))
        return tuple(out)

    def _check_ids(self, prompt: tuple[int, ...], param: str) -> tuple[int, ...]:
        for token_id in prompt:
            if not 0 <= token_id < self.vocab_size:
                raise BadRequestError(
                    f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})", param=param
                )
        return prompt

    def make_copies(self, num_copies: int) -> int:
        """Make the pool workers' private tokenizers now, up to `num_copies` in all, and the
        calling thread's copy for short prompts; how many the workers have. Off the serving path
        (the fleet calls it on its loading thread): one copy holds the GIL for ~65 ms (SmolLM2's
        tokenizer, measured), a stall of every stream and of the event loop when a worker had to
        make it on its first busy moment. Without it, short prompts go to the workers too."""
        if self._inline_copy is None:
            self._inline_copy = self._new_copy()
        while self.num_copies < num_copies:
            private = self._new_copy()
            if private is None:
                break
            with self._copies_lock:
                self._copies.append(private)
                self.num_copies += 1
        return self.num_copies

    def _new_copy(self) -> Tokenizer | None:
        if not self._copyable:
            return None
        with self._lock:  # the shared one must not change while it is copied
            try:
                return copy.deepcopy(self._tokenizer)
            except Exception:  # not copyable (a test double holding a lock): share, in turns
                self._copyable = False
                return None

    async def _tokenize(
        self,
        pool: TokenizerPool | None,
        tenant_id: str,
        size: Callable[[Any, int], int],
        fn: Callable[..., T],
        arg: Any,
    ) -> T:
        """`fn(tokenizer, arg)` on this thread when `size(arg, limit)` (the prompt's bytes, exact up
        to `limit`) is within the pool's `inline_max_bytes` and the loop has its copy; else on a
        worker of `pool`, within `tenant_id`'s share."""
        pool = self._pool(pool)
        limit, inline = pool.inline_max_bytes, self._inline_copy
        if limit > 0 and inline is not None and size(arg, limit) <= limit:
            with self._inline_lock:
                return fn(inline, arg)
        return await pool.run(tenant_id, self._with_private, fn, arg)

    def _with_private(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(tokenizer, *args)` with a tokenizer no other thread uses meanwhile."""
        with self._copies_lock:
            private = self._copies.pop() if self._copies else None
        if private is None:
            private = self._new_copy()  # more workers at once than copies made ahead
            if private is not None:
                with self._copies_lock:
                    self.num_copies += 1
        if private is None:
            with self._lock:
                return fn(self._tokenizer, *args)
        try:
            return fn(private, *args)
        finally:
            with self._copies_lock:
                self._copies.append(private)


def _render_chat(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], generation_prompt: bool = True
) -> str:
    try:
        text = tokenizer.apply_chat_template(
            [m.to_template() for m in messages], tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as exc:  # the template is the model's Jinja code: any error is the caller's input
        raise UnprocessableError(
            f"the chat template rejected the messages: {exc}", param="messages"
        ) from None
    if not isinstance(text, str):
        raise UnprocessableError("the chat template did not produce text", param="messages")
    return text


def _encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[ChatMessage],
    generation_prompt: bool = True,
    add_special_tokens: bool = False,
) -> tuple[int, ...]:
    text = _render_chat(tokenizer, messages, generation_prompt)
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise UnprocessableError("the messages produced an empty prompt", param="messages")
    return tuple(ids)


def _encode_text(tokenizer: Tokenizer, prompt: str, param: str) -> tuple[int, ...]:
    ids = tuple(tokenizer.encode(prompt, add_special_tokens=True))
    if not ids:
        raise BadRequestError("the prompt is empty", param=param)
    return ids


def _encode_plain(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _decode(tokenizer: Tokenizer, token_ids: tuple[int, ...]) -> str:
    return tokenizer.decode(list(token_ids), skip_special_tokens=False)


def _text_bytes(text: str, limit: int) -> int:
    return prompts_bytes((text,), limit)


def _ids_bytes(token_ids: tuple[int, ...], limit: int) -> int:
    return prompts_bytes((token_ids,), limit)
