"""Prompt building: the chat template, the completion prompt forms, token names for logprobs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.gateway.harness import tokenizer
from tests.gateway.tiny_tokenizer import word_token_id
from weir.gateway.api.protocol import ChatMessage, Role
from weir.gateway.http.errors import BadRequestError, UnprocessableError
from weir.gateway.prompts.prompt_limits import INLINE_MAX_ITEMS
from weir.gateway.prompts.tokenization import PromptBuilder
from weir.gateway.prompts.tokenizer_pool import TokenizerPool

# Long enough to have been tokenized on a worker thread before issue 21 (now every prompt is).
INLINE_TOKENIZE_CHARS = 4096


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


class _BorrowCheckingTokenizer:
    """Raises like a fast tokenizer's Rust object does when two threads use it at once."""

    def __init__(self) -> None:
        self._in_use = threading.Lock()
        self.calls = 0

    def _use(self) -> None:
        if not self._in_use.acquire(blocking=False):
            raise RuntimeError("Already borrowed")
        try:
            self.calls += 1
            time.sleep(0.002)  # widen the window in which a second thread would collide
        finally:
            self._in_use.release()

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self._use()
        return "".join(m["content"] for m in conversation)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self._use()
        return [ord(c) % 100 for c in text] or [1]

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        self._use()
        return "x"

    def __len__(self) -> int:
        return 100


def _run_in_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    """`work(i)` on `count` threads at once, joined; what they raised (asserted on this thread)."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_take_turns_on_the_shared_tokenizer() -> None:
    tokenizer = _BorrowCheckingTokenizer()
    builder = PromptBuilder(tokenizer)

    def work(i: int) -> None:
        for j in range(10):
            builder.encode_prompt(f"prompt {i} {j}")
            builder.encode_chat([ChatMessage(Role.USER, f"hi {i} {j}")])
            builder.token_text(i * 10 + j)

    assert _run_in_threads(work, 8) == []
    assert tokenizer.calls == 8 * 10 * 4  # encode_prompt 1 + encode_chat 2 + token_text 1


class _GatedTokenizer:
    """Records the thread of every call; `encode` of a text starting with "slow" waits for `gate`.

    Copies (one per pool worker) share the record and the gate, as copies of one model's
    tokenizer share its vocabulary.
    """

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.done: list[str] = []
        self.gate = threading.Event()

    def __deepcopy__(self, memo: dict[int, Any]) -> _GatedTokenizer:
        twin = _GatedTokenizer.__new__(_GatedTokenizer)
        twin.threads, twin.done, twin.gate = self.threads, self.done, self.gate
        return twin

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return "".join(m["content"] for m in conversation)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.get_ident())
        if text.startswith("slow"):
            self.gate.wait(30)  # a hang guard; the test opens it
        self.done.append(text[:4])
        return [1] * len(text.split())

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return "x"

    def __len__(self) -> int:
        return 100


def test_by_default_no_prompt_is_tokenized_or_rendered_on_the_event_loop() -> None:
    tok = _GatedTokenizer()
    builder = PromptBuilder(tok)

    async def main() -> int:
        await builder.encode_prompts_async(["hi"])  # short: it used to run inline
        await builder.encode_chat_async([ChatMessage(Role.USER, "hi")])
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(tok.threads) == 3 and loop_thread not in tok.threads


def _inline_pool(limit: int = 16) -> TokenizerPool:
    return TokenizerPool(num_workers=1, tenant_share=1.0, inline_max_bytes=limit)


def test_short_prompts_are_tokenized_on_the_loop_and_longer_ones_on_a_worker() -> None:
    tok = _GatedTokenizer()
    builder = PromptBuilder(tok)
    builder.make_copies(1)
    pool = _inline_pool(16)

    async def main() -> list[tuple[str, bool]]:
        loop_thread = threading.get_ident()
        seen = []

        async def where(label: str, call: Any) -> None:
            before = len(tok.threads)
            await call
            seen.append((label, all(t == loop_thread for t in tok.threads[before:])))

        await where("chat 16 bytes", builder.encode_chat_async([ChatMessage(Role.USER, "x" * 16)], pool, "t"))
        await where("chat 17 bytes", builder.encode_chat_async([ChatMessage(Role.USER, "x" * 17)], pool, "t"))
        await where(
            "chat 9 bytes, 2 chars", builder.encode_chat_async([ChatMessage(Role.USER, "世界é")], pool)
        )
        await where(
            "chat 18 bytes, 9 chars", builder.encode_chat_async([ChatMessage(Role.USER, "é" * 9)], pool)
        )
        many = [ChatMessage(Role.USER, "a")] * (INLINE_MAX_ITEMS + 1)  # 9 bytes, but many
        await where("chat of many messages", builder.encode_chat_async(many, pool))
        await where("prompts 16 bytes", builder.encode_prompts_async(["x" * 10, "y" * 6], pool))
        await where("prompts 17 bytes", builder.encode_prompts_async(["x" * 10, "y" * 7], pool))
        await where("ids", builder.encode_prompts_async([(1, 2, 3)], pool))
        return seen

    assert asyncio.run(main()) == [
        ("chat 16 bytes", True),
        ("chat 17 bytes", False),
        ("chat 9 bytes, 2 chars", True),
        ("chat 18 bytes, 9 chars", False),
        ("chat of many messages", False),
        ("prompts 16 bytes", True),
        ("prompts 17 bytes", False),
        ("ids", True),
    ]


def test_without_the_loops_own_copy_short_prompts_go_to_a_worker() -> None:
    tok = _GatedTokenizer()
    builder = PromptBuilder(tok)  # no make_copies: no copy for the loop, and none made on it

    async def main() -> int:
        await builder.encode_chat_async([ChatMessage(Role.USER, "hi")], _inline_pool())
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert tok.threads and loop_thread not in tok.threads


def test_a_short_prompt_waits_for_no_worker() -> None:
    tok = _GatedTokenizer()
    builder = PromptBuilder(tok)
    builder.make_copies(1)
    pool = _inline_pool(16)  # one worker, all of it the tenant's share

    async def main() -> None:
        slow = asyncio.ensure_future(builder.encode_prompts_async(["slow " * 10], pool, "a"))
        while not tok.threads:  # the long one holds the only worker
            await asyncio.sleep(0.001)
        assert pool.num_busy == 1
        assert await builder.encode_chat_async([ChatMessage(Role.USER, "fast")], pool, "a") == (1,)
        assert tok.done == ["fast"]
        tok.gate.set()
        await slow

    asyncio.run(main())
    assert tok.done == ["fast", "slow"]


@pytest.mark.parametrize("text", ["hello world", "héllo wörld 世界", "", "<|im_start|>user", "hello " * 100])
def test_the_loop_and_a_worker_give_the_same_ids_and_errors(text: str) -> None:
    builder = PromptBuilder(tokenizer())
    builder.make_copies(1)
    inline, workers = _inline_pool(512), _inline_pool(0)

    async def both(call: Any) -> tuple[Any, Any]:
        out = []
        for pool in (inline, workers):
            try:
                out.append(await call(pool))
            except (BadRequestError, UnprocessableError) as exc:
                out.append((type(exc), exc.param, exc.message))
        return out[0], out[1]

    async def main() -> None:
        chat = [ChatMessage(Role.SYSTEM, "be brief"), ChatMessage(Role.USER, text)]
        a, b = await both(lambda pool: builder.encode_chat_async(chat, pool))
        assert a == b == builder.encode_chat(chat)
        a, b = await both(lambda pool: builder.encode_prompts_async([text], pool))
        assert a == b
        a, b = await both(lambda pool: builder.encode_prompts_async([(1,), (builder.vocab_size,)], pool))
        assert a == b and a[1] == "prompt[1]"

    asyncio.run(main())


def test_a_long_tokenization_does_not_hold_up_another_prompt() -> None:
    tok = _GatedTokenizer()
    builder = PromptBuilder(tok)

    async def main() -> None:
        slow = asyncio.ensure_future(builder.encode_prompts_async(["slow " * 2000]))
        while not tok.threads:  # the slow one has started on its worker
            await asyncio.sleep(0.001)
        # Its own tokenizer copy: no lock shared with the one tokenizing the slow prompt.
        assert await builder.encode_chat_async([ChatMessage(Role.USER, "fast")]) == (1,)
        assert tok.done == ["fast"]
        tok.gate.set()
        await slow

    asyncio.run(main())
    assert tok.done == ["fast", "slow"]


class _CountedCopies(_GatedTokenizer):
    """A `_GatedTokenizer` that counts the copies made of it (on any thread)."""

    copies = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _GatedTokenizer:
        _CountedCopies.copies += 1
        return super().__deepcopy__(memo)


def test_copies_made_ahead_serve_the_workers_and_none_is_made_while_serving() -> None:
    _CountedCopies.copies = 0
    builder = PromptBuilder(_CountedCopies())
    # Three for the workers and one for short prompts tokenized on the calling thread.
    assert builder.make_copies(3) == 3 and _CountedCopies.copies == 4
    assert builder.make_copies(2) == 3  # never fewer, never more than asked

    def work(i: int) -> None:
        builder._with_private(lambda tok, text: tok.encode(text), f"prompt {i}")

    assert _run_in_threads(work, 3) == []
    assert _CountedCopies.copies == 4 and builder.num_copies == 3


def test_more_workers_than_copies_made_ahead_make_one_more_each() -> None:
    _CountedCopies.copies = 0
    builder = PromptBuilder(_CountedCopies())
    builder.make_copies(1)
    held = threading.Event()
    release = threading.Event()

    def hold(tok: Any) -> None:
        held.set()
        release.wait(30)  # a hang guard; the test sets it

    thread = threading.Thread(target=builder._with_private, args=(hold,))
    thread.start()
    try:
        assert held.wait(30)
        assert builder._with_private(lambda tok: tok.encode("x")) == [1]  # the one copy is busy
    finally:
        release.set()
        thread.join()
    assert builder.num_copies == 2 and _CountedCopies.copies == 3  # and the inline one


def test_a_tokenizer_that_cannot_be_copied_is_shared_in_turns() -> None:
    builder = PromptBuilder(_BorrowCheckingTokenizer())  # holds a lock: deepcopy fails
    assert builder.make_copies(4) == 0
    assert builder._with_private(lambda tok, text: tok.encode(text), "ab") == [97 % 100, 98 % 100]
