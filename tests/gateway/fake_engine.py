"""A fake `EngineClient` for gateway tests: deterministic tokens, delays, failures, a block count.

Tokens are words of `tiny_tokenizer.WORDS`, each written as " word". With temperature 0 every
choice writes the same words (a function of the prompt); with a seed, a function of (seed,
prompt, choice); otherwise random. Stop strings are honoured with a hold-back, like the real
detokenizer. KV blocks are counted per choice (`ceil(tokens / block_size)`) and returned on
finish, on `abort` (at once) and when the stream is closed, so tests can assert they all come back.
Beam search is not simulated beyond its cost: a finished beam search choice reports the tokens
the real engine would have computed for all its beams (`num_computed_output_tokens`).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tests.gateway.tiny_tokenizer import SPECIAL_TOKENS, WORDS
from weir.engine.client import EngineHealth, EngineRequest
from weir.engine.engine_stats import EngineStats
from weir.engine.errors import EngineDeadError, RequestFailedError
from weir.engine.kv.prefix_cache_types import (
    FlushResult,
    InvalidPrefixError,
    PinCapacityError,
    PrefixCacheStats,
    ScopeCacheStats,
    SharedPrefixInfo,
    TenantCacheStats,
    UnknownPrefixError,
)
from weir.engine.output import RequestMetrics, RequestOutput, TokenLogprob
from weir.engine.request import FinishReason

FIRST_WORD_ID = len(SPECIAL_TOKENS)


@dataclass
class _Choice:
    index: int
    rng: random.Random
    text: str = ""
    num_emitted_chars: int = 0
    num_tokens: int = 0
    num_blocks: int = 0
    finished: bool = False
    token_times: list[float] = field(default_factory=list)


def _rng(request: EngineRequest, index: int) -> random.Random:
    params = request.sampling_params
    if params.temperature == 0:
        key = repr(request.prompt_token_ids)
    elif params.seed is not None:
        key = f"{params.seed}|{request.prompt_token_ids!r}|{index}"
    else:
        return random.Random()
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


def num_beam_tokens(beam_width: int, num_tokens: int) -> int:
    """Tokens the engine's beam group samples for `num_tokens` steps: one after the prefill, then
    one per beam per step."""
    return 0 if num_tokens == 0 else 1 + (num_tokens - 1) * beam_width


def _holdback(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that starts some stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                longest = max(longest, k)
                break
    return longest


class FakeEngine:
    """Implements `weir.engine.client.EngineClient`; knobs are plain attributes tests may change."""

    def __init__(
        self,
        *,
        num_total_blocks: int = 256,
        block_size: int = 4,
        token_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        num_cached_tokens: int = 0,
    ) -> None:
        self.num_total_blocks = num_total_blocks
        self.num_free_blocks = num_total_blocks
        self.block_size = block_size
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.num_cached_tokens = num_cached_tokens
        self.eos_after: int | None = None  # finish with "stop" after this many tokens (unless ignore_eos)
        self.fail_request: Callable[[EngineRequest], Exception | None] | None = (
            None  # raised before any output
        )
        self.error_after_tokens: int | None = None  # then finish with FinishReason.ERROR
        self.raise_after_tokens: int | None = None  # then raise RequestFailedError from the stream
        self.alive = True
        self.ready = True
        self.num_preemptions = 0
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self._blocks: dict[str, list[_Choice]] = {}
        self._abort_flags: set[str] = set()

    # -- EngineClient ---------------------------------------------------------------------------

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Record the request and return its output stream."""
        self.requests.append(request)
        return self._run(request)

    async def abort(self, request_id: str) -> None:
        """Free the request's blocks at once; its stream ends at its next step."""
        self.aborted.append(request_id)
        self._abort_flags.add(request_id)
        self._free(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self._blocks),
            num_waiting=0,
            num_total_blocks=self.num_total_blocks,
            num_free_blocks=self.num_free_blocks,
            block_size=self.block_size,
            prefix_cache_queries=10,
            prefix_cache_hits=4,
            num_preemptions=self.num_preemptions,
        )

    def health(self) -> EngineHealth:
        return EngineHealth(alive=self.alive, ready=self.alive and self.ready, detail="fake")

    # -- test helpers ---------------------------------------------------------------------------

    @property
    def num_generate_calls(self) -> int:
        return len(self.requests)

    @property
    def num_active(self) -> int:
        return len(self._blocks)

    def reset(self) -> None:
        """Back to the constructor's knobs (keeps the pool size and block size)."""
        self.__init__(num_total_blocks=self.num_total_blocks, block_size=self.block_size)  # type: ignore[misc]

    # -- internals ------------------------------------------------------------------------------

    def _free(self, request_id: str) -> None:
        for choice in self._blocks.pop(request_id, []):
            self.num_free_blocks += choice.num_blocks
            choice.num_blocks = 0

    def _grow(self, choice: _Choice, num_tokens: int) -> None:
        needed = -(-num_tokens // self.block_size) - choice.num_blocks
        if needed > self.num_free_blocks:
            raise RequestFailedError("fake engine: out of KV blocks")
        self.num_free_blocks -= needed
        choice.num_blocks += needed

    async def _run(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if not self.alive:
            raise EngineDeadError("fake engine is dead")
        if self.fail_request is not None:
            error = self.fail_request(request)
            if error is not None:
                raise error
        rid = request.request_id
        params = request.sampling_params
        prompt_len = len(request.prompt_token_ids)
        choices = [_Choice(i, _rng(request, i)) for i in range(params.n)]
        self._blocks[rid] = choices
        try:
            for choice in choices:
                self._grow(choice, prompt_len)
            first_scheduled = time.monotonic()
            await asyncio.sleep(self.first_token_delay_s)
            step = 0
            while not all(c.finished for c in choices):
                if step and self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                else:
                    await asyncio.sleep(0)  # let others (and disconnects) run
                step += 1
                for choice in choices:
                    if rid in self._abort_flags:
                        return
                    if choice.finished:
                        continue
                    yield self._step(request, choice, prompt_len, first_scheduled)
        finally:
            self._free(rid)
            self._abort_flags.discard(rid)

    def _step(
        self, request: EngineRequest, choice: _Choice, prompt_len: int, first_scheduled: float
    ) -> RequestOutput:
        params = request.sampling_params
        if self.raise_after_tokens is not None and choice.num_tokens >= self.raise_after_tokens:
            raise RequestFailedError("fake engine: injected failure")
        word_index = choice.rng.randrange(len(WORDS))
        token_id = FIRST_WORD_ID + word_index
        choice.num_tokens += 1
        choice.token_times.append(time.monotonic())
        self._grow(choice, prompt_len + choice.num_tokens)
        choice.text += " " + WORDS[word_index]
        finish: FinishReason | None = None
        stop_reason: str | None = None
        end = len(choice.text)
        cut = [(choice.text.find(s), s) for s in params.stop if s in choice.text]
        if cut:
            end, stop_reason = min(cut)
            finish = FinishReason.STOP
        elif self.error_after_tokens is not None and choice.num_tokens >= self.error_after_tokens:
            finish = FinishReason.ERROR
        elif self.eos_after is not None and choice.num_tokens >= self.eos_after and not params.ignore_eos:
            finish = FinishReason.STOP
        elif choice.num_tokens >= params.max_tokens:
            finish = FinishReason.LENGTH
        else:
            end -= _holdback(choice.text, params.stop)
        new_text = choice.text[choice.num_emitted_chars : end]
        choice.num_emitted_chars = max(end, choice.num_emitted_chars)
        logprobs = None
        if params.logprobs is not None:
            top = tuple(
                (FIRST_WORD_ID + (word_index + k) % len(WORDS), -0.5 - 0.25 * k)
                for k in range(params.logprobs)
            )
            logprobs = (TokenLogprob(token_id, -0.5, top),)
        metrics = None
        if finish is not None:
            choice.finished = True
            now = time.monotonic()
            times = choice.token_times
            metrics = RequestMetrics(
                arrival_s=request.arrival_s,
                queue_s=first_scheduled - request.arrival_s,
                ttft_s=times[0] - request.arrival_s,
                tpot_s=(times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
                e2e_s=now - request.arrival_s,
                itl_s=tuple(b - a for a, b in zip(times, times[1:], strict=False)),
            )
        return RequestOutput(
            request_id=request.request_id,
            index=choice.index,
            new_token_ids=(token_id,),
            new_text=new_text,
            finished=finish is not None,
            finish_reason=finish,
            stop_reason=stop_reason,
            new_logprobs=logprobs,
            num_prompt_tokens=prompt_len,
            num_cached_tokens=min(self.num_cached_tokens, prompt_len),
            num_output_tokens=choice.num_tokens,
            num_computed_output_tokens=(
                num_beam_tokens(params.beam_width, choice.num_tokens)
                if finish is not None and params.use_beam_search
                else 0
            ),
            metrics=metrics,
            error="fake engine: injected error" if finish is FinishReason.ERROR else None,
        )


class FakePrefixCache:
    """A `PrefixCacheControl` double: records calls; a tiny registry of prefixes p0, p1, ..."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.prefixes: dict[str, SharedPrefixInfo] = {}
        self.dead = False
        self.max_pinned = 2

    def _check(self) -> None:
        if self.dead:
            raise EngineDeadError("stopped")

    async def stats(self) -> PrefixCacheStats:
        self._check()
        return self.snapshot()

    def snapshot(self) -> PrefixCacheStats:
        tenant = TenantCacheStats("acme", "acme", 3, 300, 240, 10, 160, 2)
        return PrefixCacheStats(
            enabled=True, model_version="v1", block_size=16, num_total_blocks=100, num_free_blocks=60,
            num_cached_blocks=30, num_pinned_blocks=4, num_queries=5, num_queried_tokens=500,
            num_hit_tokens=300, num_evictions=7, num_flushed=1, max_cached_blocks_per_scope=50,
            tenants=(tenant,), scopes=(ScopeCacheStats("acme", 10, 2), ScopeCacheStats("<shared>", 4, 0)),
        )  # fmt: skip

    async def register(self, token_ids: Sequence[int], name: str = "", pin: bool = False) -> SharedPrefixInfo:
        self._check()
        self.calls.append(("register", (list(token_ids), name, pin)))
        if len(token_ids) < 4:
            raise InvalidPrefixError("too short", "token_ids")
        if pin and sum(p.pinned for p in self.prefixes.values()) >= self.max_pinned:
            raise PinCapacityError(3, self.max_pinned)
        pid = f"p{len(self.prefixes)}"
        info = SharedPrefixInfo(pid, name or pid, len(token_ids), len(token_ids) // 4 * 4, len(token_ids) // 4,
                                len(token_ids) // 4, pin, time.time())  # fmt: skip
        self.prefixes[pid] = info
        return info

    async def list_prefixes(self) -> tuple[SharedPrefixInfo, ...]:
        return tuple(self.prefixes.values())

    def _get(self, prefix_id: str) -> SharedPrefixInfo:
        if prefix_id not in self.prefixes:
            raise UnknownPrefixError(prefix_id)
        return self.prefixes[prefix_id]

    async def get(self, prefix_id: str) -> SharedPrefixInfo:
        return self._get(prefix_id)

    async def pin(self, prefix_id: str) -> SharedPrefixInfo:
        self.prefixes[prefix_id] = replace(self._get(prefix_id), pinned=True)
        return self.prefixes[prefix_id]

    async def unpin(self, prefix_id: str) -> SharedPrefixInfo:
        self.prefixes[prefix_id] = replace(self._get(prefix_id), pinned=False)
        return self.prefixes[prefix_id]

    async def unregister(self, prefix_id: str) -> SharedPrefixInfo:
        return self.prefixes.pop(self._get(prefix_id).prefix_id)

    async def flush(
        self,
        model_version: str | None = None,
        tenant_id: str | None = None,
        cache_scope: str | None = None,
        include_pinned: bool = False,
    ) -> FlushResult:
        self.calls.append(("flush", (model_version, tenant_id, cache_scope, include_pinned)))
        return FlushResult(5, model_version in (None, "v1"))
