"""A durable spool of usage records on local disk: append-only segments, read back in order.

The usage writer appends every record here, and fsyncs it, before it tries the database; the
database side reads the spool from its cursor, in append order, and moves the cursor only past
a committed batch. Appending is two steps: `write` puts records in the file (the page cache: a
crash of the process keeps them, a crash of the machine may not), from any thread; `sync`
fsyncs what was written, and only then does the reader see it. A database outage therefore only
delays records, and a crash leaves them on disk, where the next start reads them again (the
database skips a record it already stored, so reading a record twice is harmless).

Layout: `<dir>/seg-<time_ns>-<pid>-<seq>.jsonl`, one record per line (`weir.tenancy.usage.usage_codec`).
- Each segment this process uses is held with an exclusive `flock`, so processes sharing a
  directory never take each other's segments. A segment no live process holds is a leftover
  (of a crash, or of a stop while the database was down): `open` adopts it, before new records.
- The active segment is sealed at `segment_bytes` and a new one started; a segment is deleted
  once every record in it is committed, and at `close` when nothing is pending, so the disk holds
  what is pending plus at most one segment.
- A line that does not decode (a torn write at a crash) is logged and skipped, never fatal.

Threads: writers (`write`: the usage writer's spool thread, and the event loop for a stream's
first record), one syncing thread (`sync`, `append`) and one reader (`read`, `commit`), as
`UsageWriter` runs them. A failed fsync rewrites what it did not make durable (the writes since
the last good one, kept until then), so a retry syncs them again.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from weir.tenancy.usage.usage_codec import CorruptRecordError, decode_record, encode_record
from weir.tenancy.usage.usage_records import UsageRecordIn

log = logging.getLogger(__name__)

SEGMENT_GLOB = "seg-*.jsonl"
# A record line is well under 2 KiB (bounded fields); anything longer is corruption.
_MAX_LINE_BYTES = 64 * 1024
_COUNT_CHUNK = 1 << 20


@dataclass
class _Segment:
    path: Path
    handle: BinaryIO  # holds the flock; the appender writes the active segment through it
    size: int  # bytes on disk and fsync'd: the reader never reads past it
    num_lines: int  # lines in those bytes (a torn last line counts)
    sealed: bool  # no more appends: the reader drops it once past its end
    # The writers' side (under the spool's `_append_lock`): the writes past `size`, in order,
    # kept until fsync'd (an fsync that failed leaves no promise about them: they are written
    # again). `torn`: the file past `size` no longer matches them (a failed write or rewrite);
    # the next write or sync rebuilds it.
    unsynced: list[bytes] = field(default_factory=list)
    torn: bool = False

    @property
    def written(self) -> int:
        """Bytes in the file, fsync'd or not: where the next write goes."""
        return self.size + sum(len(data) for data in self.unsynced)

    @property
    def written_lines(self) -> int:
        """Lines in the file, fsync'd or not (each record is one line)."""
        return self.num_lines + sum(data.count(b"\n") for data in self.unsynced)


@dataclass(frozen=True)
class SpoolBatch:
    """Records read from the spool, to `commit` once they are in the database."""

    records: tuple[UsageRecordIn, ...]
    num_lines: int  # records plus the corrupt lines skipped on the way
    start: int  # byte offsets in the first segment
    end: int


class UsageSpool:
    """Append-only, fsync'd segments of usage records in one directory."""

    def __init__(self, directory: Path, *, segment_bytes: int = 1 << 20) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()  # guards the segment deque, sizes and counts
        # Guards the active segment's file end and its writers' fields; taken before `_lock`,
        # never held across an fsync (a writer on the event loop must not wait for the disk).
        self._append_lock = threading.Lock()
        self._sealing: _Segment | None = None  # rotated out, its last writes not yet fsync'd
        self._segments: collections.deque[_Segment] = collections.deque()
        self._active: _Segment | None = None
        self._offset = 0  # the reader's cursor in self._segments[0]
        self._num_lines_committed = 0  # lines before the cursor in self._segments[0]
        self._reader: tuple[Path, BinaryIO] | None = None
        self._seq = 0
        self.num_corrupt = 0  # lines skipped because they did not decode
        self._num_left = 0  # after close: the lines left on disk for the next start

    @property
    def num_pending(self) -> int:
        """Lines on disk not yet committed: records, plus corrupt lines not yet skipped."""
        with self._lock:
            return self._num_pending_locked() if self._segments else self._num_left

    def _num_pending_locked(self) -> int:
        return sum(s.num_lines for s in self._segments) - self._num_lines_committed

    # -- set-up and tear-down --------------------------------------------------------------------

    def open(self) -> int:
        """Create the directory, adopt leftover segments, start a fresh one; returns the leftovers.

        The leftover count is of lines, a torn last line included (it is skipped when read).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        num_adopted = 0
        for path in sorted(self.directory.glob(SEGMENT_GLOB)):
            segment = _adopt(path)
            if segment is None:
                continue  # a live process holds it (or it just went away)
            log.warning("usage spool: replaying %d record(s) left in %s", segment.num_lines, path.name)
            with self._lock:
                self._segments.append(segment)
            num_adopted += segment.num_lines
        active = self._new_segment()
        with self._lock:
            self._segments.append(active)
            self._active = active
        return num_adopted

    def close(self) -> None:
        """Release the segments; delete them when every record is committed, else keep them."""
        with self._append_lock, self._lock:
            # Written counts, not fsync'd ones: a record written and not yet synced is kept too.
            written = sum(s.written_lines for s in self._segments) - self._num_lines_committed
            self._num_left = max(written, self._num_pending_locked())
            for segment in self._segments:
                if self._num_left == 0:
                    segment.path.unlink(missing_ok=True)
                segment.handle.close()  # releases the flock: the next start adopts what is left
            self._segments.clear()
            self._active = None
            self._offset = self._num_lines_committed = 0
            if self._reader is not None:
                self._reader[1].close()
                self._reader = None

    # -- the writers and the syncing thread -----------------------------------------------------

    def write(self, records: list[UsageRecordIn]) -> None:
        """Write records at the end of the active segment, without fsyncing: in the page cache when
        this returns, so a crash of the process keeps them; `sync` makes them survive the
        machine's, and visible to the reader. Any thread; one write system call.

        Raises OSError (disk full, I/O error) with the segment cut back to its last good end,
        so a failed write leaves no partial line behind; the caller keeps the records.
        """
        if not records:
            return
        data = b"".join(encode_record(r) for r in records)
        with self._append_lock:
            active = self._active
            if active is None:
                raise RuntimeError("the usage spool is not open")
            fd = active.handle.fileno()
            if active.torn:
                _rebuild(active)
            try:
                _write_all(fd, data)
            except OSError:
                _cut(active, active.written)
                raise
            active.unsynced.append(data)

    def sync(self) -> None:
        """Fsync what was written (by any writer) and let the reader see it; rotate the active
        segment once it is full. One thread at a time (the usage writer's spool thread).

        Raises OSError when an fsync fails: what it covered is written again, and the next
        `sync` retries it.
        """
        if self._sealing is not None:  # rotated out by a sync that failed: finish it first
            self._sync_segment(self._sealing)
            self._seal(self._sealing)
        active = self._active
        if active is None:
            raise RuntimeError("the usage spool is not open")
        self._sync_segment(active)
        if active.written < self._segment_bytes:
            return
        fresh = self._new_segment()  # a file create and a directory fsync: outside the locks
        with self._append_lock, self._lock:
            self._segments.append(fresh)
            self._active = fresh
            self._sealing = active
        self._sync_segment(active)  # what was written between the first fsync and the swap
        self._seal(active)

    def append(self, records: list[UsageRecordIn]) -> None:
        """`write` then `sync`: on disk, and readable, when this returns."""
        self.write(records)
        self.sync()

    def _sync_segment(self, segment: _Segment) -> None:
        with self._append_lock:
            if segment.torn:
                _rebuild(segment)
            end, lines, num_writes = segment.written, segment.written_lines, len(segment.unsynced)
        if end == segment.size:
            return
        try:
            os.fsync(segment.handle.fileno())
        except OSError:
            with self._append_lock:  # the failed fsync promises nothing: write those bytes again
                segment.torn = True
                _rebuild(segment)
            raise
        with self._append_lock, self._lock:  # together: a rebuild starts from `size`
            del segment.unsynced[:num_writes]
            segment.size = end
            segment.num_lines = lines

    def _seal(self, segment: _Segment) -> None:
        with self._lock:
            segment.sealed = True
        self._sealing = None

    # -- the reader thread -----------------------------------------------------------------------

    def read(self, max_records: int) -> SpoolBatch | None:
        """Up to `max_records` records from the cursor on, oldest first; None when caught up.

        Records come from one segment at a time. Reading does not move the cursor: `commit` does.
        """
        with self._lock:
            while True:
                if not self._segments:
                    return None
                first = self._segments[0]
                if self._offset < first.size:
                    break
                if not first.sealed:
                    return None
                self._drop_first_locked()
            limit = first.size
        reader = self._reader_for(first.path)
        reader.seek(self._offset)
        pos = self._offset
        records: list[UsageRecordIn] = []
        num_lines = 0
        while pos < limit and len(records) < max_records:
            line, pos = _read_line(reader, pos, limit)
            if not line:
                break  # the file is shorter than it was: cut from outside; take what is there
            num_lines += 1
            try:
                records.append(decode_record(line))
            except CorruptRecordError as exc:
                self.num_corrupt += 1
                torn = "a torn last line" if pos >= limit and not line.endswith(b"\n") else "a corrupt line"
                log.error(
                    "usage spool: skipped %s in %s at byte %d (%s): %r",
                    torn, first.path.name, pos - len(line), exc, line[:200],
                )  # fmt: skip
        if num_lines == 0:  # shorter than recorded: cut by someone else; give up on the rest
            log.error("usage spool: %s ends before byte %d; skipped the rest", first.path.name, limit)
            with self._lock:
                if first.sealed:
                    self._drop_first_locked()
            return None
        return SpoolBatch(tuple(records), num_lines, self._offset, pos)

    def commit(self, batch: SpoolBatch) -> None:
        """Move the cursor past a batch now in the database; delete a segment once past its end."""
        with self._lock:
            if batch.start != self._offset:
                raise ValueError(f"commit out of order: batch at {batch.start}, cursor at {self._offset}")
            self._offset = batch.end
            self._num_lines_committed += batch.num_lines
            first = self._segments[0]
            if first.sealed and self._offset >= first.size:
                self._drop_first_locked()

    # -- internals -------------------------------------------------------------------------------

    def _drop_first_locked(self) -> None:
        segment = self._segments.popleft()
        self._offset = 0
        self._num_lines_committed = 0
        if self._reader is not None and self._reader[0] == segment.path:
            self._reader[1].close()
            self._reader = None
        segment.path.unlink(missing_ok=True)  # before the flock goes, so nobody adopts it
        segment.handle.close()

    def _reader_for(self, path: Path) -> BinaryIO:
        if self._reader is None or self._reader[0] != path:
            if self._reader is not None:
                self._reader[1].close()
            self._reader = (path, path.open("rb"))
        return self._reader[1]

    def _new_segment(self) -> _Segment:
        while True:
            self._seq += 1
            path = self.directory / f"seg-{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            handle = os.fdopen(fd, "ab", buffering=0)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another process's `open` adopted it between our create and lock: it drops the
                # empty file; take a new name.
                handle.close()
                continue
            _fsync_directory(self.directory)  # the new name survives a crash
            return _Segment(path, handle, size=0, num_lines=0, sealed=False)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _cut(segment: _Segment, end: int) -> None:
    """After a failed write: cut the file back to `end`; if even that fails, mark it torn."""
    try:
        os.ftruncate(segment.handle.fileno(), end)
    except OSError:
        segment.torn = True
        log.exception("usage spool: could not cut %s back after a failed write", segment.path.name)


def _rebuild(segment: _Segment) -> None:
    """Under the append lock: the file past the fsync'd end written again from `unsynced`.
    Raises OSError (and stays torn) if that fails too."""
    fd = segment.handle.fileno()
    os.ftruncate(fd, segment.size)
    _write_all(fd, b"".join(segment.unsynced))
    segment.torn = False


def _adopt(path: Path) -> _Segment | None:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    if not path.exists():  # its owner dropped it (unlink, then unlock) while we waited
        handle.close()
        return None
    size = os.fstat(handle.fileno()).st_size
    num_lines = _count_lines(handle, size)
    return _Segment(path, handle, size, num_lines, sealed=True)


def _count_lines(handle: BinaryIO, size: int) -> int:
    """Lines in the first `size` bytes, a last line without its newline included."""
    handle.seek(0)
    count, last = 0, b"\n"
    remaining = size
    while remaining > 0:
        chunk = handle.read(min(_COUNT_CHUNK, remaining))
        if not chunk:
            break
        count += chunk.count(b"\n")
        last = chunk[-1:]
        remaining -= len(chunk)
    return count + (0 if last == b"\n" else 1)


def _read_line(reader: BinaryIO, pos: int, limit: int) -> tuple[bytes, int]:
    """The line at `pos` (newline included, if it has one) and the position after it.

    A line longer than `_MAX_LINE_BYTES` is corruption: its start is returned (it fails to
    decode) and the rest, up to and including its newline, is skipped.
    """
    line = reader.readline(min(limit - pos, _MAX_LINE_BYTES))
    pos += len(line)
    if line and not line.endswith(b"\n"):
        while pos < limit:  # an over-long line: skip to its end
            rest = reader.readline(min(limit - pos, _MAX_LINE_BYTES))
            if not rest:
                break
            pos += len(rest)
            if rest.endswith(b"\n"):
                break
    return line, pos


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
