"""Stored-response writes off the request's path, in batches, and reads that wait for them.

A finished `/v1/responses` answer is stored in the background (`PendingWrites.submit`, when its
last bytes are ready), so the client does not wait for the database insert. The writes queue up
per tenant; one writer thread of this class's own (not the event loop's default executor, which
other worker-thread calls share) stores what is queued, up to `WriteBounds.max_batch` records taken
round robin over the tenants, in one `ResponseStore.put_many` call (one transaction): a transaction
costs about the same for one record as for dozens (~2 ms of CPU for one record on SQLite, most
of it SQLAlchemy's and the commit's). So a batch gathers for up to `WriteBounds.gather_s` (20 ms)
before it is taken, unless it is full, a reader waits for one of its writes, or the server drains;
while a batch is in flight the next records gather too.

Bounded, so a stalled database costs a bounded amount:
- a batch's store call is awaited at most `timeout_s`: past it its writes count as failed (the
  thread's statement timeouts end the call; a record it still commits is found by id after all)
  and the next batch waits for the thread to be free;
- at most `WriteBounds.max_pending` writes are pending (queued or in flight), `.max_pending_per_tenant`
  of one tenant, so one tenant's flood never refuses another tenant's writes. A write past a
  bound is refused.

A write that is refused or fails is logged and counted (`weir_stored_response_write_failures_total`;
a record of the batch fails alone: when the batch's call fails as a whole its records are stored
one by one, within the batch's bound); the answer was served and stays served; its id then answers
404. Every write submitted ends exactly once: stored, refused or failed.

The read-after-write contract holds on this replica: a GET, input-items list, DELETE or
`previous_response_id` naming an id whose write is still pending waits for that write first
(`PendingWrites.wait`, bounded by `timeout_s`: past it, 503 with Retry-After). Pending writes are
keyed by (tenant, id): one tenant never waits on another's write. Another replica does not see
this replica's pending writes: there a read of an id whose insert is not yet committed answers
404 (for the few milliseconds the insert takes); a client that reads back at once should stay on
the replica that answered (the load balancer's session affinity) or retry a 404 once.

At shutdown `drain` waits, at most `timeout_s`, for the queue to be stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from weir.gateway.routes.response_quota import store_unavailable
from weir.tenancy.responses.response_records import ResponseStore, StoredResponse

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteBounds:
    """How many records a transaction stores, and how many writes may be pending (queued or in
    flight, each holding its record) on this replica, and of one tenant."""

    max_batch: int = 64
    max_pending: int = 2048
    max_pending_per_tenant: int = 256
    gather_s: float = 0.02  # how long a batch short of `max_batch` waits for more (0: never)

    def __post_init__(self) -> None:
        if not 1 <= self.max_pending_per_tenant <= self.max_pending or self.max_batch < 1:
            raise ValueError(f"need max_batch >= 1 and 1 <= max_pending_per_tenant <= max_pending: {self}")
        if not 0 <= self.gather_s < 1:
            raise ValueError(f"gather_s must be in [0, 1), got {self.gather_s}")


@dataclass(slots=True, eq=False)
class _Write:
    tenant: str
    record: StoredResponse
    on_failure: Callable[[str], None] | None
    done: asyncio.Future[None] | None = None  # made when a reader first waits


class PendingWrites:
    """The stored-response writes of this replica: queued per tenant, stored in batches by one
    thread, each (tenant, response id) pending until its write ends."""

    def __init__(
        self,
        store: ResponseStore,
        timeout_s: float,
        registry: CollectorRegistry | None = None,
        bounds: WriteBounds = WriteBounds(),
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.store = store
        self.timeout_s = timeout_s
        self.bounds = bounds
        self._pending: dict[tuple[str, str], _Write] = {}
        self._per_tenant: dict[str, int] = {}  # pending writes per tenant
        self._queued: dict[str, deque[_Write]] = {}  # not yet in a batch; the next tenant to take from first
        self._flusher: asyncio.Task[None] | None = None
        self._num_queued = 0
        self._hurry = asyncio.Event()  # a full batch or a waiting reader: take the batch now
        self._draining = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weir-response-writes")
        self._failures = Counter(
            "weir_stored_response_write_failures",
            "Stored /v1/responses answers whose database write failed or was refused (served, then "
            "not found by id).",
            registry=registry,
        )

    def __len__(self) -> int:
        return len(self._pending)

    def submit(
        self, tenant: str, record: StoredResponse, on_failure: Callable[[str], None] | None = None
    ) -> bool:
        """Queue the write of the tenant's `record`; reads of its id wait for it. False when it is
        refused (too many pending writes): logged and counted as a failed write. `on_failure(tenant)`
        runs on the event loop when the write is refused or fails."""
        write = _Write(tenant, record, on_failure)
        if len(self._pending) >= self.bounds.max_pending:
            self._fail(write, f"{self.bounds.max_pending} stored-response writes are pending on this replica")
            return False
        num_pending = self._per_tenant.get(tenant, 0)
        if num_pending >= self.bounds.max_pending_per_tenant:
            self._fail(write, f"{num_pending} stored-response writes of this tenant are pending")
            return False
        self._pending[(tenant, record.response_id)] = write
        self._per_tenant[tenant] = num_pending + 1
        queue = self._queued.get(tenant)
        if queue is None:
            queue = self._queued[tenant] = deque()
        queue.append(write)
        self._num_queued += 1
        if self._num_queued >= self.bounds.max_batch:
            self._hurry.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return True

    def _take_batch(self) -> list[_Write]:
        """Up to `max_batch` queued writes, one per tenant in turn, the longest-served tenant last."""
        batch: list[_Write] = []
        while self._queued and len(batch) < self.bounds.max_batch:
            tenant = next(iter(self._queued))
            queue = self._queued.pop(tenant)
            batch.append(queue.popleft())
            self._num_queued -= 1
            if queue:
                self._queued[tenant] = queue  # to the back of the turn
        return batch

    async def _flush(self) -> None:
        """Store the queue, a batch at a time, until it is empty."""
        loop = asyncio.get_running_loop()
        while self._queued:
            await self._gather()
            batch = self._take_batch()
            items = [(w.tenant, w.record) for w in batch]
            deadline = time.monotonic() + self.timeout_s
            call = loop.run_in_executor(self._executor, self._store_batch, items, deadline)
            done, _ = await asyncio.wait({call}, timeout=self.timeout_s)
            if call in done:
                self._settle(batch, call.result())
                continue
            failure = TimeoutError(f"the response store did not answer within {self.timeout_s} s")
            self._settle(batch, [failure] * len(batch))
            await asyncio.wait({call})  # the thread is free again (its statement timeouts end the call)

    async def _gather(self) -> None:
        """Let a batch short of `max_batch` gather for up to `gather_s`, unless a reader waits or
        the server drains."""
        if self.bounds.gather_s > 0 and not self._draining and self._num_queued < self.bounds.max_batch:
            if not self._hurry.is_set():
                try:
                    await asyncio.wait_for(self._hurry.wait(), self.bounds.gather_s)
                except TimeoutError:
                    pass
        self._hurry.clear()

    def _store_batch(
        self, items: Sequence[tuple[str, StoredResponse]], deadline: float
    ) -> list[Exception | None]:
        """On the writer thread: the batch in one call, else (that call failed) one by one, each
        record alone, until `deadline`."""
        try:
            return self.store.put_many(items)
        except Exception as exc:
            if len(items) == 1:
                return [exc]
            logger.warning(
                "a batch of %d stored responses failed (%s); storing them one by one", len(items), exc
            )
        outcomes: list[Exception | None] = []
        for tenant, record in items:
            if time.monotonic() >= deadline:
                outcomes.append(TimeoutError("the batch's time ran out before this record"))
                continue
            try:
                self.store.put(tenant, record)
            except Exception as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes

    def _settle(self, batch: Sequence[_Write], outcomes: Sequence[Exception | None]) -> None:
        """On the event loop: each write of the batch ends, stored or failed; its readers go on."""
        for write, outcome in zip(batch, outcomes, strict=True):
            key = (write.tenant, write.record.response_id)
            self._pending.pop(key, None)
            left = self._per_tenant[write.tenant] - 1
            if left:
                self._per_tenant[write.tenant] = left
            else:
                del self._per_tenant[write.tenant]
            if outcome is not None:
                self._fail(write, outcome)
            if write.done is not None and not write.done.done():
                write.done.set_result(None)

    def _fail(self, write: _Write, why: Exception | str) -> None:
        self._failures.inc()
        logger.error(
            "could not store the response %s of tenant %s: %s",
            write.record.response_id,
            write.tenant,
            why,
            exc_info=why if isinstance(why, Exception) else None,
        )
        if write.on_failure is not None:
            write.on_failure(write.tenant)

    async def wait(self, tenant: str, response_id: str) -> None:
        """Return once no write of the tenant's `response_id` is pending (at once when none is);
        DatabaseUnavailableError (503) when it does not end within `timeout_s`."""
        write = self._pending.get((tenant, response_id))
        if write is None:
            return
        self._hurry.set()  # a reader waits: no gathering for its batch
        if write.done is None:
            write.done = asyncio.get_running_loop().create_future()
        try:
            # shield: a reader that gives up (or is cancelled) leaves the future to other readers
            await asyncio.wait_for(asyncio.shield(write.done), self.timeout_s)
        except TimeoutError:
            raise store_unavailable() from None

    async def drain(self) -> None:
        """Wait for the pending writes to end (shutdown), at most `timeout_s`."""
        self._draining = True
        self._hurry.set()
        flusher = self._flusher
        if flusher is None or flusher.done():
            return
        await asyncio.wait({flusher}, timeout=self.timeout_s)
        if self._pending:  # stalled past the bound: leave them, log, go on
            logger.warning("%d stored-response writes are still pending at shutdown", len(self._pending))
