"""Stored-response writes in the background, in batches on their own thread: reads wait for a
pending write of their tenant's id (bounded: then 503), a batch stores what queued while the last
one ran, a bad record fails alone, a stalled store bounds what is pending (per tenant and in all)
without holding other tenants' reads, failed and refused writes are logged and counted, and
shutdown drains the queue."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from weir.gateway.http.errors import DatabaseUnavailableError
from weir.gateway.routes.response_quota import store_call
from weir.gateway.routes.response_writes import PendingWrites, WriteBounds
from weir.tenancy.errors import TenantNotFoundError
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import StoredResponse

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
FAILURES = "weir_stored_response_write_failures_total"


def _record(response_id: str) -> StoredResponse:
    return StoredResponse(response_id, {"id": response_id}, (), NOW, NOW + dt.timedelta(days=1))


class FakeStore(MemoryResponseStore):
    """A blocking store (called off the loop, as the database is) whose batches can be held, and
    whose records named in `bad` are refused (a batch holding one fails as a whole)."""

    inline = False

    def __init__(self, bad: Iterable[str] = ()) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.bad = set(bad)
        self.batches: list[list[str]] = []  # the ids of each put_many call
        self.threads: set[str] = set()

    def put_many(self, items: Sequence[tuple[str, StoredResponse]]) -> list[Exception | None]:
        self.threads.add(threading.current_thread().name)
        self.batches.append([record.response_id for _, record in items])
        self.gate.wait(30)
        if any(record.response_id in self.bad for _, record in items):
            raise OSError("a bad record fails the transaction")
        return super().put_many(items)

    def put(self, tenant: str, record: StoredResponse) -> None:
        if record.response_id in self.bad:
            raise OSError(f"disk gone for {record.response_id}")
        super().put(tenant, record)

    def stored(self, tenant: str) -> set[str]:
        return {r.response_id for r in self._records.get(tenant, {}).values()}


def test_a_read_waits_for_the_pending_write_of_its_id_only() -> None:
    async def run() -> None:
        store = FakeStore()
        store.gate.clear()
        writes = PendingWrites(store, timeout_s=30)
        assert writes.submit("a", _record("resp_1"))
        assert len(writes) == 1
        await writes.wait("b", "resp_1")  # another tenant's id: nothing to wait for
        await writes.wait("a", "resp_2")
        reader = asyncio.ensure_future(writes.wait("a", "resp_1"))
        await asyncio.sleep(0.05)
        assert not reader.done()  # held until the write ends
        store.gate.set()
        await reader
        assert store.stored("a") == {"resp_1"} and len(writes) == 0
        assert store.threads == {"weir-response-writes_0"}  # its own thread, not the default executor

    asyncio.run(run())


def test_writes_queued_during_a_batch_go_in_the_next_one_round_robin_over_tenants() -> None:
    async def run() -> None:
        store = FakeStore()
        store.gate.clear()
        writes = PendingWrites(store, timeout_s=30, bounds=WriteBounds(max_batch=4))
        writes.submit("a", _record("a0"))  # the first batch, held
        await asyncio.sleep(0.05)
        for i in range(1, 5):
            writes.submit("a", _record(f"a{i}"))
        writes.submit("b", _record("b0"))
        store.gate.set()
        await writes.drain()
        assert store.batches == [["a0"], ["a1", "b0", "a2", "a3"], ["a4"]]
        assert store.stored("a") == {f"a{i}" for i in range(5)} and store.stored("b") == {"b0"}

    asyncio.run(run())


def test_writes_gather_into_one_batch_unless_a_reader_waits() -> None:
    """A transaction costs about the same for one record as for many: writes submitted within the
    gather window go in one batch; a reader waiting for a queued write takes its batch at once."""

    async def run() -> None:
        store = FakeStore()
        writes = PendingWrites(store, timeout_s=30, bounds=WriteBounds(gather_s=0.5))
        for i in range(3):
            writes.submit("a", _record(f"a{i}"))
            await asyncio.sleep(0.01)
        writes.submit("b", _record("b0"))
        started = time.monotonic()
        await writes.wait("b", "b0")  # no 0.5 s gathering for a batch a reader waits on
        assert time.monotonic() - started < 0.4
        assert store.batches == [["a0", "b0", "a1", "a2"]]
        writes.submit("a", _record("a3"))
        await writes.drain()  # nor for one the server drains
        assert store.batches[-1] == ["a3"] and len(writes) == 0

    asyncio.run(run())


def test_one_bad_record_fails_alone_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    forgotten: list[str] = []

    async def run() -> None:
        store = FakeStore(bad=["resp_bad"])
        store.gate.clear()
        writes = PendingWrites(store, timeout_s=30, registry=registry)
        writes.submit("a", _record("resp_0"), forgotten.append)
        await asyncio.sleep(0.05)
        for name in ("resp_1", "resp_bad", "resp_2"):
            writes.submit("a", _record(name), forgotten.append)
        store.gate.set()
        await writes.wait("a", "resp_bad")  # returns: the read then finds nothing (404)
        await writes.drain()
        assert store.stored("a") == {"resp_0", "resp_1", "resp_2"}
        assert store.batches[1] == ["resp_1", "resp_bad", "resp_2"]  # then one by one

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert registry.get_sample_value(FAILURES) == 1 and forgotten == ["a"]
    assert "resp_bad" in caplog.text and "disk gone" in caplog.text


def test_a_record_put_many_refuses_fails_alone() -> None:
    class TenantGone(FakeStore):
        def put_many(self, items: Sequence[tuple[str, StoredResponse]]) -> list[Exception | None]:
            stored = [(t, r) for t, r in items if t != "gone"]
            super().put_many(stored)
            return [TenantNotFoundError(t) if t == "gone" else None for t, _ in items]

    registry = CollectorRegistry()

    async def run() -> None:
        store = TenantGone()
        writes = PendingWrites(store, timeout_s=30, registry=registry)
        writes.submit("gone", _record("resp_1"))
        writes.submit("a", _record("resp_2"))
        await writes.drain()
        assert store.stored("a") == {"resp_2"} and store.stored("gone") == set()

    asyncio.run(run())
    assert registry.get_sample_value(FAILURES) == 1


def test_a_stalled_store_bounds_pending_writes_and_holds_no_other_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()

    async def run() -> None:
        store = FakeStore()
        store.put("b", _record("resp_b"))
        store.gate.clear()  # the database stalls
        writes = PendingWrites(
            store,
            timeout_s=0.2,
            registry=registry,
            bounds=WriteBounds(max_pending=6, max_pending_per_tenant=4, gather_s=0),
        )
        writes.submit("a", _record("a0"))  # the batch in flight, held
        await asyncio.sleep(0.02)
        accepted = [writes.submit("a", _record(f"a{i}")) for i in range(1, 10)]
        assert accepted == [True] * 3 + [False] * 6  # one tenant's flood: its own bound
        assert [writes.submit("b", _record(f"b{i}")) for i in range(3)] == [True, True, False]  # in all
        assert len(writes) == 6 and registry.get_sample_value(FAILURES) == 7
        # Another tenant's read runs at once: the writes hold their own thread, not the default executor.
        got = await asyncio.wait_for(store_call(store, store.get, "b", "resp_b", NOW), 1)
        assert got is not None
        with pytest.raises(DatabaseUnavailableError) as info:
            await writes.wait("a", "a3")  # queued behind the stalled batch: 503 past the bound
        assert info.value.status_code == 503 and info.value.headers["Retry-After"]
        # Past its bound the batch in flight failed; the next waits for the thread to be free.
        assert registry.get_sample_value(FAILURES) == 8 and len(writes) == 5
        store.gate.set()
        await writes.drain()
        assert len(writes) == 0 and store.stored("b") == {"resp_b", "b0", "b1"}
        assert store.stored("a") == {"a0", "a1", "a2", "a3"}  # a0 was committed after all

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert "pending" in caplog.text and "did not answer within" in caplog.text


def test_drain_is_bounded_when_the_store_stalls(caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStore()

    async def run() -> None:
        store.gate.clear()
        writes = PendingWrites(store, timeout_s=0.05, bounds=WriteBounds(gather_s=0))
        writes.submit("a", _record("resp_1"))
        await asyncio.sleep(0.01)
        writes.submit("a", _record("resp_2"))
        await asyncio.wait_for(writes.drain(), 1)
        assert ("a", "resp_2") in writes._pending  # queued behind the stalled thread: left

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    store.gate.set()
    assert "still pending at shutdown" in caplog.text
    with pytest.raises(ValueError, match="timeout_s"):
        PendingWrites(store, timeout_s=0)
    with pytest.raises(ValueError, match="max_pending_per_tenant"):
        WriteBounds(max_pending=4, max_pending_per_tenant=5)
    with pytest.raises(ValueError, match="gather_s"):
        WriteBounds(gather_s=-1)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.booleans(), st.booleans()), max_size=40),
    st.integers(1, 8),
)
def test_every_write_submitted_is_stored_refused_or_failed_exactly_once(
    ops: list[tuple[str, bool, bool]], max_batch: int
) -> None:
    """Each op: a tenant, whether its record is bad, whether the loop yields after submitting it."""
    bad = {f"r{i}" for i, (_, is_bad, _) in enumerate(ops) if is_bad}
    store, registry = FakeStore(bad=bad), CollectorRegistry()
    refused: set[str] = set()

    async def run() -> None:
        writes = PendingWrites(
            store,
            timeout_s=30,
            registry=registry,
            bounds=WriteBounds(max_batch, max_pending=8, max_pending_per_tenant=5),
        )
        for i, (tenant, _, pause) in enumerate(ops):
            if not writes.submit(tenant, _record(f"r{i}")):
                refused.add(f"r{i}")
            if pause:
                await asyncio.sleep(0)
        await writes.drain()
        assert len(writes) == 0 and not writes._per_tenant and not writes._queued

    asyncio.run(run())
    stored = [record.response_id for records in store._records.values() for record in records.values()]
    failed = {f"r{i}" for i in range(len(ops))} - refused - set(stored)
    assert len(stored) == len(set(stored)) and not set(stored) & refused
    assert failed == bad - refused
    assert registry.get_sample_value(FAILURES) == len(refused) + len(failed)
    assert all(sum(batch.count(f"r{i}") for batch in store.batches) <= 1 for i in range(len(ops)))
