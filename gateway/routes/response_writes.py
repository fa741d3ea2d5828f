"""Stored-response writes off the request's path, and reads that wait for them.

A finished `/v1/responses` answer is stored by a background task started when its last bytes are
ready (`PendingWrites.start`), so the client does not wait for the database insert. The
read-after-write contract holds on this replica: a GET, input-items list, DELETE or
`previous_response_id` naming an id whose write is still pending waits for that write first
(`PendingWrites.wait`, bounded by `timeout_s`: past it, 503 with Retry-After). Pending writes are
keyed by (tenant, id): one tenant never waits on another's write.

Another replica does not see this replica's pending writes: there a read of an id whose insert is
not yet committed answers 404 (for the few milliseconds the insert takes); a client that reads
back at once should stay on the replica that answered (the load balancer's session affinity) or
retry a 404 once.

A write that fails is logged and counted (`weir_stored_response_write_failures_total`); the answer
was served and stays served; its id then answers 404. At shutdown `drain` waits for the writes
still pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter

from weir.gateway.routes.response_quota import store_unavailable

logger = logging.getLogger(__name__)


class PendingWrites:
    """The stored-response writes in flight on this replica, per (tenant, response id)."""

    def __init__(self, timeout_s: float, registry: CollectorRegistry | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.num_failed = 0
        self._failures = Counter(
            "weir_stored_response_write_failures",
            "Stored /v1/responses answers whose database write failed (served, then not found by id).",
            registry=registry,
        )

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, tenant: str, response_id: str, write: Callable[[], Awaitable[None]]) -> None:
        """Run `write` (the insert of `response_id`) in the background; reads of it wait for it."""
        key = (tenant, response_id)
        task = asyncio.get_running_loop().create_task(self._run(key, write))
        self._pending[key] = task
        task.add_done_callback(lambda _: self._pending.pop(key, None))

    async def _run(self, key: tuple[str, str], write: Callable[[], Awaitable[None]]) -> None:
        try:
            await write()
        except Exception:
            self.num_failed += 1
            self._failures.inc()
            logger.exception("could not store the response %s of tenant %s", key[1], key[0])

    async def wait(self, tenant: str, response_id: str) -> None:
        """Return once no write of the tenant's `response_id` is pending (at once when none is);
        DatabaseUnavailableError (503) when it does not finish within `timeout_s`."""
        task = self._pending.get((tenant, response_id))
        if task is None:
            return
        try:
            # shield: a reader that gives up (or is cancelled) never cancels the write
            await asyncio.wait_for(asyncio.shield(task), self.timeout_s)
        except TimeoutError:
            raise store_unavailable() from None

    async def drain(self) -> None:
        """Wait for every pending write (shutdown), each bounded as a read's wait is."""
        while self._pending:
            task = next(iter(self._pending.values()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.timeout_s)
            if not task.done():  # stalled past the bound: leave it, log, go on
                logger.warning("a stored-response write is still pending at shutdown")
                self._pending = {k: t for k, t in self._pending.items() if t is not task}
