"""The usage writer: batched, spooled to disk first, nothing lost while the database is down.

The database faults are real where it is cheap (a SQLite file locked by another connection, a
process killed with SIGKILL) and injected where it must be quick (`FlakyRepo`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from tests.gateway.harness import wait_until
from weir.engine.request import FinishReason
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import UsageRecord
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir.tenancy.usage.usage_spool import SEGMENT_GLOB
from weir.tenancy.usage.usage_writer import REJECTED_FILENAME, UsageWriter, database_unavailable

WHEN = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _record(i: int, tenant: str = "acme", status: UsageStatus = UsageStatus.COMPLETED) -> UsageRecordIn:
    return UsageRecordIn(f"r{i}", tenant, None, "m", status, prompt_tokens=i, completion_tokens=1,
                         finish_reason=FinishReason.STOP, created_at=WHEN)  # fmt: skip


def _spool_alone(writer: UsageWriter, record: UsageRecordIn) -> None:
    """Spool one record in a batch of its own, as the spool thread does for a lone request."""
    writer._spool.append([record])
    writer._wake_database()


def _stored(repo: TenancyRepo) -> dict[str, int]:
    """request_id -> number of rows."""
    with repo.db.transaction() as session:
        rows = session.execute(select(UsageRecord.request_id, func.count()).group_by(UsageRecord.request_id))
        return {request_id: n for request_id, n in rows}


class FlakyRepo:
    """A repository whose usage writes fail like an unreachable database while `down` is set."""

    def __init__(self, repo: TenancyRepo) -> None:
        self.repo = repo
        self.down = threading.Event()
        self.num_failures = 0

    def record_usages(self, records: Sequence[UsageRecordIn]) -> None:
        if self.down.is_set():
            self.num_failures += 1
            raise OperationalError("INSERT", {}, ConnectionRefusedError("connection refused"))
        self.repo.record_usages(records)


@pytest.fixture
def acme(repo: TenancyRepo) -> TenancyRepo:
    repo.create_tenant(TenantSpec("acme"), actor="t")
    return repo


def test_records_are_written_in_batches_and_drained_on_close(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, max_batch=4, flush_interval_s=0.05)
    writer.start()
    for i in range(10):
        writer.submit(_record(i))
    writer.close()
    [day] = acme.usage_by_day("acme")
    assert (day.num_requests, day.prompt_tokens) == (10, sum(range(10)))
    stats = writer.stats()
    assert (stats.num_written, stats.num_spooled, stats.num_pending, stats.num_replayed) == (10, 10, 0, 0)
    assert list(tmp_path.glob(SEGMENT_GLOB)) == []  # all committed: nothing left on disk


def test_a_record_written_twice_is_stored_once(acme: TenancyRepo) -> None:
    batch = [_record(i) for i in range(3)]
    acme.record_usages(batch)
    acme.record_usages(batch + [_record(3)])
    assert _stored(acme) == {"r0": 1, "r1": 1, "r2": 1, "r3": 1}


def test_a_later_record_of_a_request_replaces_the_stored_one(acme: TenancyRepo) -> None:
    """Issue 21 item 4: a stream's provisional records, then its final one; the last one wins,
    in one batch or across batches, and replaying them all again ends on the same row."""
    provisional = [
        dataclasses.replace(_record(7, status=UsageStatus.CANCELLED), completion_tokens=n, finish_reason=None)
        for n in (1, 9)
    ]
    final = dataclasses.replace(_record(7), completion_tokens=12)
    acme.record_usages(provisional[:1])
    acme.record_usages(provisional[1:] + [final])  # one statement never names a key twice
    acme.record_usages(provisional + [final])  # a replay of the spool, in order
    [day] = acme.usage_by_day("acme")
    assert (day.num_requests, day.num_completed, day.completion_tokens) == (1, 1, 12)
    acme.record_usages(provisional)  # a crash after the provisional ones: they are the bill
    [day] = acme.usage_by_day("acme")
    assert (day.num_requests, day.num_cancelled, day.completion_tokens) == (1, 1, 9)


def test_a_record_written_now_is_in_the_spool_file_before_its_fsync(
    acme: TenancyRepo, tmp_path: Path
) -> None:
    writer = UsageWriter(acme, tmp_path, flush_interval_s=60.0, retry_max_s=60.0)  # batches never fill
    writer.start()
    try:
        writer.write_now(_record(1))  # returns at once: no wait for the spool thread or the disk
        lines = b"".join(p.read_bytes() for p in tmp_path.glob(SEGMENT_GLOB))
        assert b'"r1"' in lines  # in the file (the page cache): a crash of the process keeps it
        assert writer.stats().num_spooled == 0  # fsync'd with its batch window, not yet
        assert writer.stats().num_pending == 1
    finally:
        writer.close()  # the stop closes the window: fsync'd, then written
    assert _stored(acme) == {"r1": 1}
    assert writer.stats().num_spooled == 1


def test_write_now_does_not_wait_for_a_stalled_disk(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, flush_interval_s=0.01, retry_max_s=0.01)
    gate, syncing = threading.Event(), threading.Event()
    sync = writer._spool.sync

    def stalled_sync() -> None:
        syncing.set()
        gate.wait(30)  # the fsync of the first batch hangs, as on a stalled disk
        sync()

    writer._spool.sync = stalled_sync  # type: ignore[method-assign]
    writer.start()
    try:
        writer.write_now(_record(0))
        assert syncing.wait(30)
        for i in range(1, 6):
            writer.write_now(_record(i))  # the event loop goes on while the spool thread is stuck
        lines = b"".join(p.read_bytes() for p in tmp_path.glob(SEGMENT_GLOB))
        assert all(f'"r{i}"'.encode() in lines for i in range(6))
    finally:
        gate.set()
        writer.close()
    assert len(_stored(acme)) == 6


def test_a_record_written_now_on_a_failing_disk_raises(
    acme: TenancyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = UsageWriter(acme, tmp_path, flush_interval_s=60.0, retry_max_s=60.0)
    writer.start()
    try:
        real_write = os.write

        def disk_full(fd: int, data: bytes | memoryview) -> int:
            if fd == writer._spool._active.handle.fileno():  # type: ignore[union-attr]
                raise OSError(28, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", disk_full)
        with pytest.raises(OSError, match="No space"):
            writer.write_now(_record(1))  # the caller logs it and streams on without it
        monkeypatch.undo()
        writer.write_now(_record(2))
    finally:
        writer.close()
    assert _stored(acme) == {"r2": 1}


class CountingEvent(threading.Event):
    """An Event that counts its `set` calls: how often a submit signalled the spool thread."""

    def __init__(self) -> None:
        super().__init__()
        self.num_sets = 0

    def set(self) -> None:
        self.num_sets += 1
        super().set()


def _burst(writer: UsageWriter, put: Callable[[UsageRecordIn], None]) -> None:
    """Twenty records, once the spool thread waits for a first one."""
    assert wait_until(lambda: writer._idle)
    for i in range(20):
        put(_record(i))


def test_a_burst_wakes_the_spool_thread_once_and_is_spooled_in_one_append(
    acme: TenancyRepo, tmp_path: Path
) -> None:
    writer = UsageWriter(acme, tmp_path, max_batch=100, flush_interval_s=0.3)
    ready = writer._ready = CountingEvent()
    appends: list[int] = []
    write = writer._spool.write
    writer._spool.write = lambda records: (appends.append(len(records)), write(records))[1]  # type: ignore[method-assign]
    writer.start()
    try:
        _burst(writer, writer.submit)
        assert ready.num_sets == 1  # the first record opened the batch; the other 19 did not signal
        assert wait_until(lambda: writer.stats().num_spooled == 20)
        assert appends == [20]  # one write (and one fsync)
    finally:
        writer.close()
    assert len(_stored(acme)) == 20


def test_a_burst_written_now_wakes_the_spool_thread_once_and_is_fsync_d_once(
    acme: TenancyRepo, tmp_path: Path
) -> None:
    writer = UsageWriter(acme, tmp_path, max_batch=100, flush_interval_s=0.3)
    ready = writer._ready = CountingEvent()
    syncs: list[int] = []
    sync = writer._spool.sync
    writer._spool.sync = lambda: (syncs.append(writer.stats().num_spooled), sync())[1]  # type: ignore[method-assign]
    writer.start()
    try:
        _burst(writer, writer.write_now)
        assert ready.num_sets == 1  # the first opened the batch window; the other 19 did not signal
        assert wait_until(lambda: writer.stats().num_spooled == 20)
        assert syncs == [0]  # one fsync for the 20
    finally:
        writer.close()
    assert len(_stored(acme)) == 20


def test_a_full_batch_is_spooled_without_waiting_for_its_window(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, max_batch=4, flush_interval_s=60.0, retry_max_s=60.0)
    writer.start()
    try:
        for i in range(9):
            writer.submit(_record(i))
        assert wait_until(lambda: writer.stats().num_spooled == 8)  # two full batches, not held 60 s
        assert writer.stats().num_spooled == 8  # the ninth waits for its window (or the stop)
    finally:
        writer.close()
    assert len(_stored(acme)) == 9


class CountingRepo:
    """A repository that counts its usage transactions and the records in each."""

    def __init__(self, repo: TenancyRepo) -> None:
        self.repo = repo
        self.batches: list[int] = []

    def record_usages(self, records: Sequence[UsageRecordIn]) -> None:
        self.batches.append(len(records))
        self.repo.record_usages(records)


def test_records_spooled_one_by_one_gather_into_few_transactions(acme: TenancyRepo, tmp_path: Path) -> None:
    # Each record is spooled (fsync'd) on its own, as lone requests are; the database thread
    # writes the first at once, then lets the next ones gather.
    counting = CountingRepo(acme)
    writer = UsageWriter(counting, tmp_path, max_batch=64, flush_interval_s=30.0, retry_max_s=30.0)  # type: ignore[arg-type]
    wake = writer._wake = CountingEvent()
    writer.start()
    try:
        _spool_alone(writer, _record(0))
        # the first at once (counted as its write starts; committed to the spool's cursor after)
        assert wait_until(lambda: counting.batches == [1] and writer.stats().num_pending == 0)
        assert wake.num_sets == 1  # the database thread waited for a first record
        for i in range(1, 12):
            _spool_alone(writer, _record(i))
        assert counting.batches == [1]  # the other 11 wait in the spool
        assert writer.stats().num_pending == 11
        assert wake.num_sets == 1  # and did not wake the gathering database thread, one by one
    finally:
        writer.close()  # the stop ends the wait: everything is written
    assert counting.batches == [1, 11]
    assert len(_stored(acme)) == 12


def test_a_full_batch_in_the_spool_ends_the_wait(acme: TenancyRepo, tmp_path: Path) -> None:
    counting = CountingRepo(acme)
    writer = UsageWriter(counting, tmp_path, max_batch=4, flush_interval_s=30.0, retry_max_s=30.0)  # type: ignore[arg-type]
    writer.start()
    try:
        _spool_alone(writer, _record(0))
        assert wait_until(lambda: counting.batches == [1])
        for i in range(1, 5):
            _spool_alone(writer, _record(i))
        assert wait_until(lambda: counting.batches == [1, 4])  # not held for the 30 s window
    finally:
        writer.close()
    assert len(_stored(acme)) == 5


def test_a_refused_record_is_kept_aside_and_the_batch_is_written(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, max_batch=100)
    for i in range(5):
        writer.submit(_record(i, tenant="deleted" if i == 2 else "acme"))
    writer.close()  # never started: starts, drains, stops
    assert acme.usage_by_day("acme")[0].num_requests == 4
    stats = writer.stats()
    assert (stats.num_written, stats.num_rejected, stats.num_pending) == (4, 1, 0)
    [line] = (tmp_path / REJECTED_FILENAME).read_text().splitlines()
    kept = json.loads(line)
    assert kept["request_id"] == "r2" and "deleted" in kept["error"]


def test_a_record_written_now_into_a_full_queue_raises(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, max_queue=1)
    gate = threading.Event()
    sync = writer._spool.sync
    writer._spool.sync = lambda: (gate.wait(30), sync())[1]  # type: ignore[method-assign]
    writer.start()
    try:
        writer.submit(_record(0))
        assert wait_until(lambda: writer._items.__len__() == 0)  # taken: the spool thread is stuck
        writer.submit(_record(1))  # fills the queue behind it
        with pytest.raises(OSError, match="queue is full"):
            writer.write_now(_record(2))  # the disk stalled for max_queue records: refused, counted
        assert writer.stats().num_dropped == 1
    finally:
        gate.set()
        writer.close()
    assert _stored(acme) == {"r0": 1, "r1": 1}


def test_full_queue_drops_instead_of_blocking(acme: TenancyRepo, tmp_path: Path) -> None:
    writer = UsageWriter(acme, tmp_path, max_queue=2)
    for i in range(3):
        writer.submit(_record(i))
    assert writer.stats().num_dropped == 1
    writer.close()
    assert writer.stats().num_written == 2


def test_settings_are_validated(repo: TenancyRepo, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        UsageWriter(repo, tmp_path, max_batch=0)
    with pytest.raises(ValueError, match="retry_max_s"):
        UsageWriter(repo, tmp_path, flush_interval_s=1.0, retry_max_s=0.5)


def test_errors_that_mean_try_again_later() -> None:
    refused = OperationalError("SELECT 1", {}, ConnectionRefusedError())
    assert database_unavailable(refused)
    try:
        raise RuntimeError("wrapped") from refused
    except RuntimeError as wrapped:
        assert database_unavailable(wrapped)
    assert not database_unavailable(ValueError("bad record"))


def test_no_record_is_lost_while_the_database_is_down(acme: TenancyRepo, tmp_path: Path) -> None:
    flaky = FlakyRepo(acme)
    flaky.down.set()
    writer = UsageWriter(flaky, tmp_path, max_batch=8, flush_interval_s=0.02, retry_max_s=0.05)  # type: ignore[arg-type]
    writer.start()
    for i in range(50):
        writer.submit(_record(i))
    assert wait_until(lambda: writer.stats().num_spooled == 50 and flaky.num_failures >= 3)
    stats = writer.stats()
    assert (stats.num_pending, stats.num_written, stats.database_available) == (50, 0, False)
    flaky.down.clear()
    assert wait_until(lambda: writer.stats().num_pending == 0)
    writer.close()
    assert _stored(acme) == {f"r{i}": 1 for i in range(50)}
    stats = writer.stats()
    assert stats.num_replayed == 50 and stats.database_available


def test_a_stop_while_the_database_is_down_keeps_records_for_the_next_start(
    acme: TenancyRepo, tmp_path: Path
) -> None:
    flaky = FlakyRepo(acme)
    flaky.down.set()
    writer = UsageWriter(flaky, tmp_path, flush_interval_s=0.02, retry_max_s=0.05)  # type: ignore[arg-type]
    for i in range(20):
        writer.submit(_record(i))
    writer.close(timeout_s=0.5)
    assert writer.stats().num_pending == 20 and _stored(acme) == {}
    after = UsageWriter(acme, tmp_path, flush_interval_s=0.02)
    after.start()
    assert wait_until(lambda: after.stats().num_pending == 0)
    after.close()
    assert _stored(acme) == {f"r{i}": 1 for i in range(20)}
    assert after.stats().num_replayed == 20
    assert list(tmp_path.glob(SEGMENT_GLOB)) == []


class StuckRepo:
    """A repository whose usage writes hang until released: a very slow database."""

    def __init__(self, repo: TenancyRepo) -> None:
        self.repo = repo
        self.release = threading.Event()
        self.entered = threading.Event()

    def record_usages(self, records: Sequence[UsageRecordIn]) -> None:
        self.entered.set()
        assert self.release.wait(30)
        self.repo.record_usages(records)


def test_a_slow_database_does_not_hold_records_in_memory(acme: TenancyRepo, tmp_path: Path) -> None:
    """While a database call hangs, later records still reach the disk (the spool has its own thread)."""
    stuck = StuckRepo(acme)
    writer = UsageWriter(stuck, tmp_path, max_batch=4, flush_interval_s=0.02)  # type: ignore[arg-type]
    writer.start()
    writer.submit(_record(0))
    assert stuck.entered.wait(10)  # the database thread is inside a write that does not return
    for i in range(1, 30):
        writer.submit(_record(i))
    assert wait_until(lambda: writer.stats().num_spooled == 30)
    assert writer.stats().num_pending == 30
    stuck.release.set()
    assert wait_until(lambda: writer.stats().num_pending == 0)
    writer.close()
    assert _stored(acme) == {f"r{i}": 1 for i in range(30)}


@pytest.mark.slow
def test_a_locked_sqlite_file_delays_records_but_loses_none(tmp_path: Path) -> None:
    """The defect as reported: the SQLite file locked (BEGIN EXCLUSIVE) by another connection."""
    from weir.migrations.migrate import upgrade
    from weir.tenancy.keys.keys import KeyHasher

    path = tmp_path / "weir.db"
    db = Database(f"sqlite:///{path}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"pepper"))
    repo.create_tenant(TenantSpec("acme"), actor="t")
    writer = UsageWriter(repo, tmp_path / "spool", flush_interval_s=0.05, retry_max_s=0.2)
    writer.start()
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        for i in range(30):
            writer.submit(_record(i))
        # The first write waits out SQLite's 5 s busy timeout, then finds the file locked.
        assert wait_until(lambda: not writer.stats().database_available, 30)
        assert writer.stats().num_pending == 30 and writer.stats().num_spooled == 30
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert wait_until(lambda: writer.stats().num_pending == 0, 30)
    writer.close()
    assert _stored(repo) == {f"r{i}": 1 for i in range(30)}
    db.dispose()


_CHILD = """
import datetime as dt, os, sys, time
from pathlib import Path
from weir.tenancy.store.db import Database
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.usage.usage_writer import UsageWriter
from tests.tenancy.usage.test_usage_writer import _record

repo = TenancyRepo(Database(sys.argv[1]), KeyHasher(b"pepper"))
writer = UsageWriter(repo, Path(sys.argv[2]), flush_interval_s=0.05)
writer.start()
for i in range(40):
    writer.submit(_record(i))
while writer.stats().num_spooled < 40:
    time.sleep(0.01)
os.fsync = lambda fd: time.sleep(60)  # the disk stalls: what follows is never fsync'd
for i in range(40, 45):
    writer.write_now(_record(i))  # a stream's first record, in the page cache only
print("SPOOLED", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_records_of_a_killed_process_are_replayed_once(tmp_path: Path) -> None:
    """kill -9 while the database is locked (and the disk stalls the last records' fsync): the
    next start writes every record, once, those only written (`write_now`) included."""
    from weir.migrations.migrate import upgrade
    from weir.tenancy.keys.keys import KeyHasher

    path, spool = tmp_path / "weir.db", tmp_path / "spool"
    url = f"sqlite:///{path}"
    db = Database(url)
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"pepper"))
    repo.create_tenant(TenantSpec("acme"), actor="t")
    repo.record_usages([_record(0), _record(1)])  # written before the crash: replayed, skipped
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, str(spool)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "SPOOLED"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        lock.execute("ROLLBACK")
        lock.close()
    assert sorted(_stored(repo)) == ["r0", "r1"]
    writer = UsageWriter(repo, spool, flush_interval_s=0.05)
    writer.start()
    assert wait_until(lambda: writer.stats().num_pending == 0, 30)
    writer.close()
    assert _stored(repo) == {f"r{i}": 1 for i in range(45)}
    assert writer.stats().num_replayed == 45
    db.dispose()
