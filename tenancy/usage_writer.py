"""Writes usage records in batches on a background thread, so the event loop never waits on SQL.

The gateway's usage sink calls `submit` (non-blocking) once per finished request; a daemon
thread writes a batch `flush_interval_s` after its first record, or at `max_batch` records,
whichever comes first. A batch that fails is retried record by record, so one bad record (e.g. for a
tenant deleted meanwhile) does not lose the others. `close` drains the queue at shutdown.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from tenancy.errors import TenancyError
from tenancy.repo import TenancyRepo
from tenancy.schemas import UsageRecordIn

log = logging.getLogger(__name__)

_STOP = object()


@dataclass
class UsageWriterStats:
    """Counters, for metrics and tests."""

    num_written: int = 0
    num_failed: int = 0  # refused by the database; logged
    num_dropped: int = 0  # the queue was full; logged


class UsageWriter:
    """A bounded queue of usage records and the thread that writes them."""

    def __init__(
        self,
        repo: TenancyRepo,
        *,
        max_batch: int = 256,
        flush_interval_s: float = 0.5,
        max_queue: int = 100_000,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self._repo = repo
        self._max_batch = max_batch
        self._flush_interval_s = flush_interval_s
        self._queue: queue.Queue[object] = queue.Queue(max_queue)
        self._thread: threading.Thread | None = None
        self.stats = UsageWriterStats()

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="weir-usage-writer", daemon=True)
            self._thread.start()

    def submit(self, record: UsageRecordIn) -> None:
        """Queue one record; never blocks. When the queue is full the record is dropped and logged."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.stats.num_dropped += 1
            log.error("usage queue full: dropped the usage record of request %s", record.request_id)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write everything queued so far, then stop the thread."""
        if self._thread is None:
            self._drain_inline()
            return
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        self._thread = None

    def _run(self) -> None:
        stop = False
        while not stop:
            batch: list[UsageRecordIn] = []
            try:
                item = self._queue.get(timeout=self._flush_interval_s)
            except queue.Empty:
                continue
            # Keep the batch open until the flush interval after its first record: at steady
            # arrival rates a batch of one costs a whole transaction per request.
            deadline = time.monotonic() + self._flush_interval_s
            while True:
                if item is _STOP:
                    stop = True
                elif isinstance(item, UsageRecordIn):
                    batch.append(item)
                if stop or len(batch) >= self._max_batch:
                    break
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
            self._write(batch)
        self._drain_inline()  # anything submitted while stopping

    def _drain_inline(self) -> None:
        batch: list[UsageRecordIn] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, UsageRecordIn):
                batch.append(item)
        for start in range(0, len(batch), self._max_batch):
            self._write(batch[start : start + self._max_batch])

    def _write(self, batch: list[UsageRecordIn]) -> None:
        if not batch:
            return
        try:
            self._repo.record_usages(batch)
            self.stats.num_written += len(batch)
            return
        except (TenancyError, SQLAlchemyError):
            if len(batch) == 1:
                self.stats.num_failed += 1
                log.exception("could not write the usage record of request %s", batch[0].request_id)
                return
        for record in batch:  # find the bad record(s); keep the rest
            self._write([record])
