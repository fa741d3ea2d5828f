"""One call in flight per key: concurrent async callers asking for the same key share its result.

A burst of requests with a key the auth cache does not hold (a new key, or one whose cache entry
just expired) would otherwise send one database lookup each, and one `last_used_at` write each:
on SQLite a burst of write transactions that lock each other out ("database is locked") and
stall the threads that run them. With `SingleFlight` the first caller runs the call (on a worker
thread) and the others await the same result, or the same exception.

The shared call is shielded: a caller that goes away (a client disconnect cancels its request)
does not cancel it for the others. A caller joins a call only under the same `generation`: the
auth cache bumps its generation on every invalidation (revocation, rotation, suspension), and a
lookup that began before one must not answer a request that arrived after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """Shares one in-flight call per key between concurrent callers (on one event loop)."""

    def __init__(self) -> None:
        self._calls: dict[K, tuple[int, asyncio.Future[V]]] = {}
        self.num_shared = 0  # callers answered by a call another caller started

    def __len__(self) -> int:
        """Calls in flight."""
        return len(self._calls)

    async def run(self, key: K, generation: int, call: Callable[[], Awaitable[V]]) -> V:
        """`await call()`, or the result of the call already in flight for `key` under `generation`."""
        pending = self._calls.get(key)
        if pending is not None and pending[0] == generation:
            self.num_shared += 1
            return await asyncio.shield(pending[1])
        future: asyncio.Future[V] = asyncio.ensure_future(call())
        self._calls[key] = (generation, future)
        future.add_done_callback(lambda done: self._forget(key, done))
        return await asyncio.shield(future)

    def _forget(self, key: K, done: asyncio.Future[V]) -> None:
        current = self._calls.get(key)
        if current is not None and current[1] is done:
            del self._calls[key]
        if not done.cancelled():
            done.exception()  # retrieved: an error nobody else awaited is not logged as lost
