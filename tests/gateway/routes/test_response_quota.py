"""The storage quota's gauge: one read per tenant per TTL, local writes added, deletes re-read."""

from __future__ import annotations

import asyncio
import datetime as dt

from weir.gateway.routes.response_quota import StoredBytesGauge
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import StoredResponse


class CountingStore(MemoryResponseStore):
    def __init__(self) -> None:
        super().__init__()
        self.num_reads = 0

    def bytes_used(self, tenant: str, now: dt.datetime) -> int:
        self.num_reads += 1
        return super().bytes_used(tenant, now)


def _record(response_id: str) -> StoredResponse:
    now = dt.datetime.now(dt.UTC)
    return StoredResponse(response_id, {"x": response_id}, (), now, now + dt.timedelta(days=1))


def test_reads_once_per_ttl_and_adds_local_writes() -> None:
    store, clock = CountingStore(), [0.0]
    gauge = StoredBytesGauge(store, ttl_s=1.0, clock=lambda: clock[0])
    first = _record("resp_1")
    store.put("a", first)

    async def run() -> None:
        assert await gauge.used("a") == first.num_bytes
        second = _record("resp_2")
        store.put("a", second)
        gauge.add("a", second.num_bytes)
        assert await gauge.used("a") == first.num_bytes + second.num_bytes
        assert store.num_reads == 1  # within the TTL: no second read
        clock[0] = 1.5
        assert await gauge.used("a") == first.num_bytes + second.num_bytes and store.num_reads == 2
        store.delete("a", "resp_1")
        gauge.forget("a")
        assert await gauge.used("a") == second.num_bytes and store.num_reads == 3
        assert await gauge.used("b") == 0  # tenants apart
        gauge.add("c", 10)  # nothing read yet for c: its next check reads the store
        assert await gauge.used("c") == 0

    asyncio.run(run())


def test_store_call_bounds_the_wait_for_a_blocking_store() -> None:
    import threading

    import pytest

    from weir.gateway.http.errors import DatabaseUnavailableError
    from weir.gateway.routes.response_quota import store_call

    gate = threading.Event()

    class Stalled(MemoryResponseStore):
        inline = False  # as the database: on a worker thread

        def bytes_used(self, tenant: str, now: dt.datetime) -> int:
            gate.wait(30)
            return 0

    store = Stalled()

    async def run() -> None:
        with pytest.raises(DatabaseUnavailableError) as info:
            await store_call(store, store.bytes_used, "a", dt.datetime.now(dt.UTC), timeout_s=0.01)
        assert info.value.status_code == 503 and info.value.headers["Retry-After"]
        gate.set()
        assert await store_call(store, store.bytes_used, "a", dt.datetime.now(dt.UTC), timeout_s=30) == 0

    asyncio.run(run())
