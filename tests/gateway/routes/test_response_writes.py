"""Stored-response writes in the background: reads wait for a pending write of their tenant's id
(bounded: then 503), a failed write is logged and counted, shutdown drains what is pending."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from weir.gateway.http.errors import DatabaseUnavailableError
from weir.gateway.routes.response_writes import PendingWrites


def test_a_read_waits_for_the_pending_write_of_its_id_only() -> None:
    async def run() -> None:
        writes, gate, done = PendingWrites(timeout_s=30), asyncio.Event(), []

        async def write() -> None:
            await gate.wait()
            done.append(True)

        writes.start("a", "resp_1", write)
        assert len(writes) == 1
        await writes.wait("b", "resp_1")  # another tenant's id: nothing to wait for
        await writes.wait("a", "resp_2")
        assert not done
        reader = asyncio.ensure_future(writes.wait("a", "resp_1"))
        await asyncio.sleep(0)
        assert not reader.done()  # held until the write ends
        gate.set()
        await reader
        assert done and len(writes) == 0

    asyncio.run(run())


def test_a_stalled_write_answers_the_reader_503_and_is_not_cancelled() -> None:
    async def run() -> None:
        writes, gate = PendingWrites(timeout_s=0.01), asyncio.Event()

        async def write() -> None:
            await gate.wait()

        writes.start("a", "resp_1", write)
        with pytest.raises(DatabaseUnavailableError) as info:
            await writes.wait("a", "resp_1")
        assert info.value.status_code == 503 and info.value.headers["Retry-After"]
        assert len(writes) == 1  # the reader gave up; the write goes on
        gate.set()
        await writes.drain()
        assert len(writes) == 0

    asyncio.run(run())


def test_a_failed_write_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()

    async def run() -> None:
        writes = PendingWrites(timeout_s=30, registry=registry)

        async def write() -> None:
            raise OSError("disk gone")

        writes.start("a", "resp_1", write)
        await writes.wait("a", "resp_1")  # returns: the read then finds nothing (404)
        assert writes.num_failed == 1

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert registry.get_sample_value("weir_stored_response_write_failures_total") == 1
    assert "resp_1" in caplog.text and "disk gone" in caplog.text


def test_drain_waits_for_every_pending_write() -> None:
    async def run() -> None:
        writes, done = PendingWrites(timeout_s=30), []

        async def write(i: int) -> None:
            await asyncio.sleep(0)
            done.append(i)

        for i in range(5):
            writes.start("a", f"resp_{i}", lambda i=i: write(i))
        await writes.drain()
        assert sorted(done) == list(range(5)) and len(writes) == 0

    asyncio.run(run())
    with pytest.raises(ValueError, match="timeout_s"):
        PendingWrites(timeout_s=0)
