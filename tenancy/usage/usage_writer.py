"""Writes usage records to the database without losing them, and without the event loop waiting.

The path of one record:
1. `submit` (on the event loop) puts it in a bounded in-memory queue; it never blocks, and it
   wakes the spool thread only when a batch opens, fills or must close at once (the stop): not
   once per record, which at 500 requests/s cost the event loop a thread switch
   and a GIL hand-off per request.
2. The spool thread takes a batch (up to `max_batch` records, or what arrives within
   `flush_interval_s` of the first one), appends it to the `UsageSpool` and fsyncs once (that
   fsync also covers the records `write_now` put in the file meanwhile).
3. The database thread reads the spool in order and writes it in batches; the spool's cursor
   moves only past a committed batch. After a short batch it lets records gather for up to
   `flush_interval_s` (a full batch or the stop ends the wait): a transaction costs about
   the same for one record as for dozens.
   While the database is unavailable (locked, unreachable, timing out) the batch stays in the
   spool and is retried with backoff (at most `retry_max_s` apart); new records are spooled
   behind it, so order is kept and memory stays bounded.
4. A record the database refuses for good (e.g. its tenant was deleted) goes to
   `rejected.jsonl` in the spool directory, with the reason, and is counted; the rest of its
   batch is written.

Records left in the spool by a crash, or by a stop while the database was down, are replayed
by the next start before new ones. A request may have several records (a stream's provisional
ones, written before its first byte and as it goes, then its final one); the repository keeps
the last written per request id and tenant, and the spool is replayed in order, so a replay
is idempotent and ends on the latest state: a stream cut by a crash is billed from its last
provisional record, and a stream that finished from its final one. `write_now` writes a record
into the spool file from the calling thread (the event loop, for a stream's records: before its
first byte, as it goes, and its final one before its last byte): one write system call, no
thread hand-off, in the page cache when it returns, so a crash of the process (kill -9) keeps
it; the spool thread fsyncs it with its batch window, like every record. A stream's records all
go through `write_now` on the one loop thread, so they reach the file in the order written.

The guarantee (also in docs/operations.md): a record is on disk once the spool thread has
fsync'd it, at most `flush_interval_s` plus one fsync after `submit` or `write_now`. A graceful
stop loses nothing (the queue is spooled before the threads end, whatever the database's
state); a crash of the process loses the `submit`ted records of that last window, never a
`write_now` one; a crash of the machine loses at most the records of that last window. A
database outage of any length loses nothing while the disk has room. Only a full in-memory
queue (the disk stalled for `max_queue` records) drops records, counted and logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from weir.tenancy.usage.usage_codec import encode_record
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir.tenancy.usage.usage_spool import UsageSpool

log = logging.getLogger(__name__)

_STOP = object()
_JOIN_GRACE_S = 1.0
REJECTED_FILENAME = "rejected.jsonl"
_UNAVAILABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)


_WRITTEN = object()  # a record `write_now` put in the spool file: the next fsync must cover it


@dataclass(frozen=True)
class UsageWriterStats:
    """A snapshot of the writer's counters, for metrics and tests."""

    num_pending: int  # accepted, not yet in the database: in memory or in the spool
    num_spooled: int  # fsync'd to the spool by this process (`write_now`'s once the fsync covers them)
    num_written: int  # committed to the database (a record already there counts once more)
    num_replayed: int  # of those, written while catching up (after a failed write, or left by a crash)
    num_rejected: int  # refused by the database for good; kept in rejected.jsonl
    num_dropped: int  # the in-memory queue was full, or the disk failed at stop: lost
    num_corrupt: int  # spool lines that did not decode (a torn write at a crash)
    database_available: bool  # False from a failed write until the next successful one


def database_unavailable(exc: BaseException) -> bool:
    """Whether an error means "try again later" (the database is down, locked or slow) rather
    than "this record is refused". Looks through wrapping errors (`raise ... from`)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, _UNAVAILABLE) or (isinstance(seen, DBAPIError) and seen.connection_invalidated):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class UsageSink(Protocol):
    """Where the writer's batches go: `weir.tenancy.repository.repo.TenancyRepo` (one transaction,
    all or none). A protocol, so usage stands below the repository that reads its records."""

    def record_usages(self, records: Sequence[UsageRecordIn]) -> None: ...


class UsageWriter:
    """A bounded queue of usage records, the spool behind it, and the two threads that move them."""

    def __init__(
        self,
        repo: UsageSink,
        spool_dir: Path,
        *,
        # Each batch is Python that holds the GIL in the writer's threads (encoding, SQLAlchemy):
        # at 500 requests/s a batch of 256 held it ~12 ms every half second, stalling the event
        # loop and the engine thread for that long; batches of 64 stall them in shorter pieces.
        max_batch: int = 64,
        flush_interval_s: float = 0.5,
        max_queue: int = 100_000,
        retry_max_s: float = 5.0,
        segment_bytes: int = 1 << 20,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if retry_max_s < flush_interval_s:
            raise ValueError(f"retry_max_s must be >= flush_interval_s, got {retry_max_s}")
        self._repo = repo
        self._spool = UsageSpool(spool_dir, segment_bytes=segment_bytes)
        self._rejected_path = spool_dir / REJECTED_FILENAME
        self._max_batch = max_batch
        self._flush_interval_s = flush_interval_s
        self._retry_max_s = retry_max_s
        self._max_queue = max_queue
        # The queue between `submit` and the spool thread; `_lock` guards it and the two flags.
        self._items: deque[object] = deque()
        self._lock = threading.Lock()
        self._idle = False  # the spool thread waits for a first record
        self._due = False  # a queued record closes the batch now: a full batch, or the stop
        self._ready = threading.Event()  # set when the spool thread must look at the queue
        self._spool_thread: threading.Thread | None = None
        self._db_thread: threading.Thread | None = None
        self._wake = threading.Event()  # the database thread has a batch to take, or stopping
        self._db_waiting = False  # the database thread waits for a first spooled record (under _lock)
        self._spool_done = threading.Event()  # the spool thread has spooled its last record
        self._stopping = threading.Event()
        self._stop_deadline = 0.0  # monotonic; set before _stopping
        self._replaying = False  # records before the spool's end were not written first time
        self._database_available = True
        # Each counter has one writing thread: submit (event loop), spool thread, database thread.
        self._num_submitted = 0
        self._num_dropped = 0
        self._num_spooled = 0
        self._num_lost = 0  # the spool thread could not write them at stop
        self._num_written = 0
        self._num_replayed = 0
        self._num_rejected = 0

    @property
    def spool_dir(self) -> Path:
        return self._spool.directory

    def stats(self) -> UsageWriterStats:
        """The counters now (read from any thread)."""
        in_memory = self._num_submitted - self._num_dropped - self._num_spooled - self._num_lost
        return UsageWriterStats(
            num_pending=max(in_memory, 0) + self._spool.num_pending,
            num_spooled=self._num_spooled,
            num_written=self._num_written,
            num_replayed=self._num_replayed,
            num_rejected=self._num_rejected,
            num_dropped=self._num_dropped + self._num_lost,
            num_corrupt=self._spool.num_corrupt,
            database_available=self._database_available,
        )

    @property
    def _started(self) -> bool:
        return self._spool_thread is not None

    def start(self) -> None:
        """Open the spool (adopting records a previous process left) and start the threads.

        Blocking file I/O: call it off the event loop. Raises OSError if the spool directory
        cannot be used, so a bad data directory stops start-up instead of losing records later.
        """
        if self._started:
            return
        num_left = self._spool.open()
        self._replaying = num_left > 0
        self._spool_thread = threading.Thread(target=self._run_spool, name="weir-usage-spool", daemon=True)
        self._db_thread = threading.Thread(target=self._run_database, name="weir-usage-db", daemon=True)
        self._spool_thread.start()
        self._db_thread.start()

    def submit(self, record: UsageRecordIn) -> None:
        """Queue one record; never blocks. When the queue is full the record is dropped and logged."""
        self._put(record, record)

    def write_now(self, record: UsageRecordIn) -> None:
        """Write one record into the spool file now, from this thread (a stream's records, on the
        event loop): in the page cache when this returns, so a crash of the process keeps it;
        fsync'd with the spool thread's batch window, like `submit`ted ones.

        One write system call and no thread hand-off: waiting for the spool thread (a wake, its
        write and fsync, a call back onto the loop) was ~0.6 ms of CPU a stream across three
        threads (docs/benchmarks.md, eighteenth stop). Raises OSError when the record could not
        be written (the disk failed, or the queue is full because the disk stalled); the
        caller goes on without it (a stream's final record then comes through `submit`).
        """
        if not self._started:
            raise RuntimeError("the usage writer is not started")
        if len(self._items) >= self._max_queue:  # the spool thread is stuck: the disk stalled
            self._num_submitted += 1
            self._num_dropped += 1
            raise OSError("the usage queue is full")
        self._spool.write([record])
        self._put(_WRITTEN, record)  # opens a batch window if none is open; never dropped

    def _put(self, item: object, record: UsageRecordIn) -> None:
        with self._lock:
            accepted = item is _WRITTEN or len(self._items) < self._max_queue
            if accepted:
                self._items.append(item)
                if len(self._items) >= self._max_batch:
                    self._due = True
                wake = self._idle or self._due
                self._idle = False  # signalled once: the next records join the batch it opens
        self._num_submitted += 1
        if not accepted:
            self._num_dropped += 1
            log.error("usage queue full: dropped the usage record of request %s", record.request_id)
        elif wake:
            self._ready.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Spool everything submitted, write what the database takes within `timeout_s`, stop.

        Records the database did not take in time stay in the spool for the next start.
        """
        if not self._started:
            self.start()
        spool_thread, db_thread = self._spool_thread, self._db_thread
        if spool_thread is None or db_thread is None:
            return
        self._stop_deadline = time.monotonic() + timeout_s
        self._stopping.set()
        with self._lock:
            self._items.append(_STOP)  # past `max_queue` if need be: the stop is never dropped
            self._due = True
        self._ready.set()
        spool_thread.join(max(self._stop_deadline - time.monotonic(), 0))
        self._wake.set()
        # A little past the deadline: a write that started before it may still be returning.
        db_thread.join(max(self._stop_deadline - time.monotonic(), 0) + _JOIN_GRACE_S)
        if db_thread.is_alive() or spool_thread.is_alive():
            log.warning(
                "usage writer: stopped with %d record(s) pending; they stay in %s for the next start",
                self.stats().num_pending,
                self._spool.directory,
            )

    # -- the spool thread ------------------------------------------------------------------------

    def _run_spool(self) -> None:
        stop = False
        while not stop:
            with self._lock:
                idle = self._idle = not self._items
                self._ready.clear()  # under the lock: a `_put` after this sets it again
                due = self._due
            if idle:
                self._ready.wait(self._flush_interval_s)
                continue
            # Keep the batch open until the flush interval after its first record: one fsync
            # per batch, not per request. A full batch or the stop closes it at once.
            if not due:
                self._ready.wait(self._flush_interval_s)
            batch, num_written, stop = self._take_batch()
            self._spool_batch(batch, num_written, stopping=stop)
        self._spool_done.set()
        self._wake.set()

    def _take_batch(self) -> tuple[list[UsageRecordIn], int, bool]:
        """Up to `max_batch` queued records, how many `write_now` records the batch's fsync
        covers, and whether the stop was reached."""
        batch: list[UsageRecordIn] = []
        num_written = 0
        with self._lock:
            while self._items and len(batch) + num_written < self._max_batch:
                item = self._items.popleft()
                if item is _STOP:
                    return batch, num_written, True
                if item is _WRITTEN:
                    num_written += 1
                elif isinstance(item, UsageRecordIn):
                    batch.append(item)
            # what stays queued is due at once if it would have closed a batch by itself
            self._due = len(self._items) >= self._max_batch or any(item is _STOP for item in self._items)
        return batch, num_written, False

    def _spool_batch(self, batch: list[UsageRecordIn], num_written: int, *, stopping: bool) -> None:
        """Write the batch into the spool, then fsync it with every `write_now` record before it."""
        delay = self._flush_interval_s
        pending = batch  # not yet in the spool file
        while True:
            try:
                self._spool.write(pending)
                pending = []
                self._spool.sync()
            except OSError:
                if stopping and time.monotonic() >= self._stop_deadline:
                    # Records already written stay in the file (the page cache): the next start
                    # replays them unless the machine goes down first.
                    if pending:
                        log.critical(
                            "usage spool: could not write; LOST %d usage record(s) at stop", len(pending)
                        )
                        self._num_lost += len(pending)
                    return
                log.exception(
                    "usage spool: could not write or fsync %d record(s); retrying in %.1f s",
                    len(batch) + num_written,
                    delay,
                )
                self._pause(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            self._num_spooled += len(batch) + num_written
            self._wake_database()
            return

    def _wake_database(self) -> None:
        """After a batch is spooled: wake the database thread if it waits for a first record or a
        full batch is there. Not per batch: each stream's first record is a batch of its own, and
        a wake that finds nothing to write still costs a thread switch and the GIL."""
        with self._lock:
            wake = self._db_waiting or self._spool.num_pending >= self._max_batch
            self._db_waiting = False
        if wake:
            self._wake.set()

    # -- the database thread ---------------------------------------------------------------------

    def _run_database(self) -> None:
        delay = self._flush_interval_s
        try:
            while True:
                self._wake.clear()  # before reading: a record spooled after this sets it again
                try:
                    batch = self._spool.read(self._max_batch)
                except OSError:
                    log.exception("usage spool: could not read; retrying in %.1f s", self._retry_max_s)
                    self._pause(self._retry_max_s)
                    continue
                if batch is None:  # caught up with the spool
                    self._replaying = False
                    if self._spool_done.is_set():
                        return
                    with (
                        self._lock
                    ):  # unless a batch was spooled since the read, the next one wakes this thread
                        waiting = self._db_waiting = self._spool.num_pending == 0
                    if waiting:
                        self._wake.wait(self._flush_interval_s)
                    continue
                if not self._write(list(batch.records)):
                    self._replaying = True
                    if self._stopping.is_set() and time.monotonic() + delay >= self._stop_deadline:
                        return  # stopping and the database is still down: the spool keeps them
                    self._pause(delay)
                    delay = min(delay * 2, self._retry_max_s)
                    continue
                self._spool.commit(batch)
                if self._replaying:
                    self._num_replayed += len(batch.records)
                delay = self._flush_interval_s
                if batch.num_lines < self._max_batch:
                    self._gather()
        finally:
            self._spool.close()

    def _gather(self) -> None:
        """After a short batch, let the next records gather in the spool for up to the flush
        interval, unless a full batch is there sooner or the writer is stopping (the spool
        thread wakes this one for those, not for each batch it spools).

        A transaction costs about the same for one record as for dozens (the tenant and price
        lookups, the statement, the commit: ~1-2 ms of Python against ~0.07 ms a record in a
        batch of 64, weir_bench.experiments.usage_batch_cost). Until the eighteenth stop every stream's
        first record was spooled on its own (fsync'd before its first byte), and writing each
        spooled batch at once made a transaction per stream: at 500 streams/s most of a core of
        GIL time. The spool already holds these records durably; the database gets them at most
        one flush interval later.
        """
        deadline = time.monotonic() + self._flush_interval_s
        while not self._stopping.is_set() and self._spool.num_pending < self._max_batch:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(left)
            self._wake.clear()

    def _pause(self, delay_s: float) -> None:
        """Sleep before a retry; cut short by a stop, but never past the stop's deadline."""
        if not self._stopping.wait(delay_s):
            return
        time.sleep(min(delay_s, max(self._stop_deadline - time.monotonic(), 0.0)))

    def _write(self, records: list[UsageRecordIn]) -> bool:
        """Write records; False when the database is unavailable (the caller retries them all)."""
        if not records:
            return True
        try:
            self._repo.record_usages(records)
        except Exception as exc:
            if database_unavailable(exc):
                if self._database_available:
                    log.warning(
                        "database unavailable (%s); usage records wait in the spool %s",
                        type(exc).__name__,
                        self._spool.directory,
                    )
                self._database_available = False
                return False
            if len(records) == 1:
                self._reject(records[0], exc)
                return True
            for record in records:  # find the bad record(s); keep the rest
                if not self._write([record]):
                    return False
            return True
        if not self._database_available:
            log.warning("database available again; replaying the usage spool")
        self._database_available = True
        self._num_written += len(records)
        return True

    def _reject(self, record: UsageRecordIn, exc: Exception) -> None:
        self._num_rejected += 1
        line = encode_record(record, error=f"{type(exc).__name__}: {exc}"[:500])
        log.error("the database refused the usage record of request %s: %s", record.request_id, exc)
        try:
            fd = os.open(self._rejected_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            log.exception("could not keep the refused usage record in %s: %s", self._rejected_path, line)
