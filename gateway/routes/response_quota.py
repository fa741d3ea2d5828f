"""Each tenant's stored-response bytes as this replica knows them, for the storage quota check.

Summing a tenant's stored responses in the database for every `/v1/responses` request would cost
a worker-thread hop and a scan that grows with what the tenant keeps, on the request's path. The
gauge reads a tenant's sum at most once per `ttl_s` and adds what this replica stored since; a
delete makes the next check read again. Other replicas' writes are seen within `ttl_s`, so a
tenant storing through several replicas at once may pass its quota by what they stored in that
window (the quota is a bound on storage, not a budget of billable work).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from weir.gateway.http.errors import DATABASE_RETRY_AFTER_S, DatabaseUnavailableError
from weir.tenancy.responses.response_records import ResponseStore

T = TypeVar("T")
DEFAULT_TTL_S = 1.0
MAX_TENANTS = 10_000  # entries kept; the oldest go first


def store_unavailable() -> DatabaseUnavailableError:
    """The 503 of a stored-response call that did not finish in time."""
    return DatabaseUnavailableError(
        "The response store did not answer in time; retry later.",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
    )


async def store_call(
    store: ResponseStore, fn: Callable[..., T], *args: object, timeout_s: float | None = None
) -> T:
    """`fn(*args)`, a call of `store`: on a worker thread when the store blocks, else here.

    `timeout_s` bounds the caller's wait (for a free worker thread, a pooled connection, the
    statements): past it, DatabaseUnavailableError (503, Retry-After). The thread's own statement
    timeouts end the abandoned call; one not yet started on a thread never runs.
    """
    if store.inline:
        return fn(*args)
    call = asyncio.to_thread(fn, *args)
    if timeout_s is None:
        return await call
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise store_unavailable() from None


@dataclass
class _Reading:
    num_bytes: int
    read_at: float


class StoredBytesGauge:
    """Stored bytes per tenant: a sum read from the store at most every `ttl_s`, plus local writes."""

    def __init__(
        self,
        store: ResponseStore,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float | None = None,
    ) -> None:
        if not ttl_s >= 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock
        self.timeout_s = timeout_s  # a read's bound (store_call)
        self._readings: dict[str, _Reading] = {}

    async def used(self, tenant: str) -> int:
        """The tenant's stored bytes, read from the store when the last reading is stale."""
        reading = self._readings.get(tenant)
        if reading is not None and self._clock() - reading.read_at < self.ttl_s:
            return reading.num_bytes
        started = self._clock()
        num_bytes = await store_call(
            self.store, self.store.bytes_used, tenant, dt.datetime.now(dt.UTC), timeout_s=self.timeout_s
        )
        if len(self._readings) >= MAX_TENANTS:
            self._readings.pop(next(iter(self._readings)))
        self._readings.pop(tenant, None)
        self._readings[tenant] = _Reading(num_bytes, started)
        return num_bytes

    def add(self, tenant: str, num_bytes: int) -> None:
        """This replica stored `num_bytes` more for the tenant."""
        reading = self._readings.get(tenant)
        if reading is not None:
            reading.num_bytes += num_bytes

    def forget(self, tenant: str) -> None:
        """The tenant's bytes went down (a delete): read them again at the next check."""
        self._readings.pop(tenant, None)
