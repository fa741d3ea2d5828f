"""The worker threads that render chat templates, tokenize prompts and check token ids.

Nothing that grows with a prompt runs on the event loop: every prompt larger than
`inline_max_bytes` (UTF-8 bytes, 512 when serving) is tokenized here, on one of `num_workers`
threads. One tenant holds at most `max_per_tenant` of them at a time; its further jobs wait in its
own line, and a freed worker goes to the next tenant in turn that is under its share. So one
tenant's huge prompts queue behind each other, not in front of everyone else's (issue 21).

A prompt of at most `inline_max_bytes` is tokenized on the calling thread instead
(`PromptBuilder`, with a tokenizer copy of the loop's own): its template and tokenizer cost a
bounded ~0.05-0.3 ms, less than the hand-off to a worker and back (the submit, the future, the
loop's wake-up, two GIL hand-offs), which cost a keyed chat ~0.3-0.6 ms of server CPU on the
2-core machine (docs/benchmarks.md, nineteenth stop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TokenizerPool:
    """A bounded pool of worker threads with a per-tenant share of them."""

    def __init__(self, num_workers: int, tenant_share: float = 0.5, inline_max_bytes: int = 0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not 0 < tenant_share <= 1:
            raise ValueError(f"tenant_share must be in (0, 1], got {tenant_share}")
        if inline_max_bytes < 0:
            raise ValueError(f"inline_max_bytes must be >= 0, got {inline_max_bytes}")
        self.num_workers = num_workers
        # Prompts of at most this many UTF-8 bytes (see `PromptBuilder`) skip the workers; 0: none.
        self.inline_max_bytes = inline_max_bytes
        self.max_per_tenant = max(1, int(num_workers * tenant_share))
        # Its own threads (started on first use): tokenization never takes the threads the event
        # loop lends everything else. Plain asyncio on the pinned loop, not anyio's `to_thread`
        # with a capacity limiter: that cost ~5% of a chat request's event-loop CPU.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            num_workers, thread_name_prefix="weir-tokenizer"
        )
        self._num_busy = 0
        self._busy: dict[str, int] = {}
        # Tenants with jobs waiting, in turn order; each with its waiters, oldest first.
        self._waiting: OrderedDict[str, deque[asyncio.Event]] = OrderedDict()

    @property
    def num_busy(self) -> int:
        """Workers running a job now."""
        return self._num_busy

    def num_waiting(self, tenant_id: str | None = None) -> int:
        """Jobs waiting for a worker (of one tenant, or of all)."""
        if tenant_id is not None:
            return len(self._waiting.get(tenant_id, ()))
        return sum(len(q) for q in self._waiting.values())

    async def run(self, tenant_id: str, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on a worker thread, once `tenant_id` may have one."""
        await self.acquire(tenant_id)
        job: concurrent.futures.Future[T] | None = None
        try:
            job = self._threads.submit(fn, *args)
            return await asyncio.wrap_future(job)
        finally:
            if job is None or job.done():
                self.release(tenant_id)
            else:
                # Cancelled while the thread runs: the worker is given back once the thread is done.
                loop = asyncio.get_running_loop()
                job.add_done_callback(lambda _: loop.call_soon_threadsafe(self.release, tenant_id))

    def _grantable(self, tenant_id: str) -> bool:
        return self._num_busy < self.num_workers and self._busy.get(tenant_id, 0) < self.max_per_tenant

    def _grant(self, tenant_id: str) -> None:
        self._num_busy += 1
        self._busy[tenant_id] = self._busy.get(tenant_id, 0) + 1

    async def acquire(self, tenant_id: str) -> None:
        """Wait for a worker within `tenant_id`'s share (`run` does this; so does a caller that runs
        the job on threads of its own, such as the grammar compiler). Pair with `release`."""
        # After every grant and release no waiter is grantable, so a grantable newcomer jumps no one.
        if self._grantable(tenant_id):
            self._grant(tenant_id)
            return
        granted = asyncio.Event()
        self._waiting.setdefault(tenant_id, deque()).append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # granted, then cancelled before it could run: give it back
                self.release(tenant_id)
            else:
                line = self._waiting[tenant_id]
                line.remove(granted)
                if not line:
                    del self._waiting[tenant_id]
            raise

    def release(self, tenant_id: str) -> None:
        """Give back a worker `acquire` granted; the next tenant in turn under its share gets it."""
        self._num_busy -= 1
        left = self._busy[tenant_id] - 1
        if left:
            self._busy[tenant_id] = left
        else:
            del self._busy[tenant_id]
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free workers to waiting tenants under their share, in turn."""
        while self._num_busy < self.num_workers:
            tenant_id = next((t for t in self._waiting if self._grantable(t)), None)
            if tenant_id is None:
                return
            line = self._waiting.pop(tenant_id)
            self._grant(tenant_id)
            line.popleft().set()
            if line:  # back of the turn order
                self._waiting[tenant_id] = line
