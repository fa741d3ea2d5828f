"""The usage spool: append, read back in order, commit, rotate, adopt leftovers, skip torn lines.

A "crash" here is a copy of the spool directory taken while the spool is open: exactly what a
killed process leaves on disk (what was written is in the page cache, fsync'd or not). The real
kill -9 is in test_usage_writer.py.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from weir.engine.request import FinishReason
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_codec import CorruptRecordError, decode_record, encode_record
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir.tenancy.usage.usage_spool import SEGMENT_GLOB, UsageSpool

WHEN = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def record(i: int) -> UsageRecordIn:
    return UsageRecordIn(f"req-{i}", "acme", "k" * 16, "m", UsageStatus.COMPLETED, prompt_tokens=i,
                         completion_tokens=1, ttft_ms=1.5, finish_reason=FinishReason.STOP,
                         created_at=WHEN)  # fmt: skip


def drain(spool: UsageSpool, max_records: int = 1000) -> list[str]:
    """Read and commit everything; the request ids in order."""
    ids: list[str] = []
    while (batch := spool.read(max_records)) is not None:
        ids.extend(r.request_id for r in batch.records)
        spool.commit(batch)
    return ids


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(SEGMENT_GLOB))


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[UsageSpool]:
    s = UsageSpool(tmp_path / "spool", segment_bytes=1000)
    assert s.open() == 0
    yield s
    s.close()


def test_a_record_survives_the_round_trip() -> None:
    r = record(7)
    line = encode_record(r)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_record(line) == r
    for bad in (b"", b"{", b"[]", b'{"v": 99}', line[:-20], line.replace(b'"acme"', b'"BAD NAME"')):
        with pytest.raises(CorruptRecordError):
            decode_record(bad)


def test_records_come_back_in_order_and_rotation_deletes_committed_segments(spool: UsageSpool) -> None:
    for i in range(0, 40, 4):
        spool.append([record(j) for j in range(i, i + 4)])
    assert spool.num_pending == 40
    assert len(segments(spool.directory)) > 2  # ~220 bytes a record, 1000-byte segments
    ids = drain(spool, max_records=3)
    assert ids == [f"req-{i}" for i in range(40)]
    assert spool.num_pending == 0
    assert len(segments(spool.directory)) == 1  # only the active segment is left
    spool.close()
    assert segments(spool.directory) == []  # nothing pending: nothing kept


def test_the_cursor_moves_only_on_commit(spool: UsageSpool) -> None:
    spool.append([record(1), record(2)])
    first = spool.read(10)
    again = spool.read(10)
    assert first is not None and again is not None and first == again  # not committed: read again
    spool.commit(first)
    assert spool.read(10) is None
    with pytest.raises(ValueError, match="out of order"):
        spool.commit(first)


def test_a_crash_leaves_records_that_the_next_start_replays_first(tmp_path: Path, spool: UsageSpool) -> None:
    spool.append([record(i) for i in range(10)])
    batch = spool.read(4)
    assert batch is not None
    spool.commit(batch)  # 0-3 are in the database
    crashed = tmp_path / "crashed"
    shutil.copytree(spool.directory, crashed)
    after = UsageSpool(crashed, segment_bytes=1000)
    assert after.open() == 10  # the cursor is not on disk: committed records come back too
    after.append([record(10)])
    assert drain(after) == [f"req-{i}" for i in range(11)]  # leftovers first, then new ones
    after.close()
    assert segments(crashed) == []


def test_a_torn_last_line_is_skipped_with_a_log_line(
    tmp_path: Path, spool: UsageSpool, caplog: pytest.LogCaptureFixture
) -> None:
    spool.append([record(1), record(2)])
    crashed = tmp_path / "crashed"
    shutil.copytree(spool.directory, crashed)
    [segment] = segments(crashed)
    with segment.open("ab") as f:
        f.write(encode_record(record(3))[:50])  # the write the crash cut short
    after = UsageSpool(crashed)
    assert after.open() == 3
    assert drain(after) == ["req-1", "req-2"]
    assert after.num_corrupt == 1 and after.num_pending == 0
    assert "torn last line" in caplog.text
    after.close()


def test_a_corrupt_line_in_the_middle_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    good = encode_record(record(1)) + encode_record(record(2))
    junk = b"\x00garbage\n" + b"x" * 100_000 + b"\n"  # over-long lines are corruption too
    (directory / "seg-0-1-000001.jsonl").write_bytes(good + junk + encode_record(record(3)))
    s = UsageSpool(directory)
    assert s.open() == 5
    assert drain(s) == ["req-1", "req-2", "req-3"]
    assert s.num_corrupt == 2 and s.num_pending == 0
    s.close()


def test_segments_of_a_live_spool_are_not_adopted(spool: UsageSpool) -> None:
    spool.append([record(1)])
    other = UsageSpool(spool.directory)
    assert other.open() == 0  # flock'd by `spool`
    assert other.read(10) is None
    other.close()
    assert drain(spool) == ["req-1"]


def test_a_failed_append_leaves_no_partial_line(spool: UsageSpool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.append([record(1)])
    real_write = os.write

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError):
        spool.append([record(2), record(3)])
    monkeypatch.undo()
    spool.append([record(2), record(3)])  # the writer retries the same batch
    assert drain(spool) == ["req-1", "req-2", "req-3"]
    assert spool.num_corrupt == 0


def test_written_records_are_read_only_once_synced(spool: UsageSpool) -> None:
    spool.write([record(1)])
    spool.write([record(2), record(3)])  # two writers' records, in the order written
    assert spool.read(10) is None and spool.num_pending == 0  # not fsync'd: not for the database yet
    with mock.patch("weir.tenancy.usage.usage_spool.os.fsync") as fsync:
        spool.sync()
        spool.sync()  # nothing new: no second fsync
    assert fsync.call_count == 1
    assert spool.num_pending == 3
    assert drain(spool) == ["req-1", "req-2", "req-3"]


def test_a_record_written_and_not_synced_is_kept_at_close(tmp_path: Path) -> None:
    s = UsageSpool(tmp_path / "spool")
    s.open()
    s.write([record(1)])
    s.close()
    after = UsageSpool(tmp_path / "spool")
    assert after.open() == 1
    assert drain(after) == ["req-1"]
    after.close()


def test_a_failed_fsync_writes_its_records_again_and_the_next_sync_keeps_them(spool: UsageSpool) -> None:
    spool.append([record(1)])
    spool.write([record(2)])
    seen: list[bytes] = []

    def fsync_fails(fd: int) -> None:
        seen.append(os.pread(fd, 10_000, 0))
        raise OSError(5, "Input/output error")

    with (
        mock.patch("weir.tenancy.usage.usage_spool.os.fsync", side_effect=fsync_fails),
        pytest.raises(OSError),
    ):
        spool.sync()
    assert spool.read(10) is not None and spool.num_pending == 1  # only the fsync'd record
    spool.write([record(3)])  # a writer goes on while the sync is retried
    spool.sync()
    assert drain(spool) == ["req-1", "req-2", "req-3"]
    assert spool.num_corrupt == 0


def test_a_record_written_while_the_full_segment_rotates_is_kept_in_order(tmp_path: Path) -> None:
    s = UsageSpool(tmp_path / "spool", segment_bytes=300)  # one record fills it
    s.open()
    s.write([record(1)])
    real_new_segment = s._new_segment

    def new_segment_with_a_write_racing_it() -> object:
        fresh = real_new_segment()
        s.write([record(2)])  # the event loop writes while the spool thread rotates
        return fresh

    with mock.patch.object(s, "_new_segment", side_effect=new_segment_with_a_write_racing_it):
        s.sync()
    s.write([record(3)])
    s.sync()
    assert drain(s) == ["req-1", "req-2", "req-3"]
    s.close()
    assert segments(s.directory) == []


class SpoolMachine(RuleBasedStateMachine):
    """Append, flush to a database that goes down and up, crash and restart (with a torn tail):
    every record appended ends up in the database exactly once, in append order."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.num_dirs = 0
        self.spool: UsageSpool | None = None

    def _new_dir(self) -> Path:
        self.num_dirs += 1
        return self.root / f"m{id(self)}-{self.num_dirs}"

    @initialize()
    def start(self) -> None:
        self.directory = self._new_dir()
        self.spool = UsageSpool(self.directory, segment_bytes=700)
        self.spool.open()
        self.appended: list[str] = []
        self.database: dict[str, UsageRecordIn] = {}  # insert-if-absent, as the repository
        self.insert_order: list[str] = []
        self.down = False
        self.next_id = 0

    @property
    def s(self) -> UsageSpool:
        assert self.spool is not None
        return self.spool

    def _next_batch(self, n: int) -> list[UsageRecordIn]:
        """`n` new records, counted as appended (in the order they go into the spool)."""
        batch = [record(self.next_id + i) for i in range(n)]
        self.next_id += n
        self.appended.extend(r.request_id for r in batch)
        return batch

    @rule(n=st.integers(1, 5))
    def append(self, n: int) -> None:
        self.s.append(self._next_batch(n))

    @rule(n=st.integers(1, 3))
    def write(self, n: int) -> None:
        """A writer that does not sync (the event loop): readable after the next sync."""
        self.s.write(self._next_batch(n))

    @rule()
    def sync(self) -> None:
        self.s.sync()

    @rule()
    def sync_fails(self) -> None:
        with mock.patch(
            "weir.tenancy.usage.usage_spool.os.fsync", side_effect=OSError(5, "Input/output error")
        ):
            try:
                self.s.sync()
            except OSError:
                pass  # the writer retries later; nothing written is lost

    @rule()
    def write_fails(self) -> None:
        real_write = os.write

        def half_then_fail(fd: int, data: bytes | memoryview) -> int:
            real_write(fd, bytes(data)[: max(len(data) // 2, 1)])
            raise OSError(28, "No space left on device")

        with (
            mock.patch("weir.tenancy.usage.usage_spool.os.write", side_effect=half_then_fail),
            pytest.raises(OSError),
        ):
            self.s.write([record(10_000 + self.next_id)])  # refused: the caller keeps it

    @rule(max_records=st.integers(1, 6))
    def flush(self, max_records: int) -> None:
        batch = self.s.read(max_records)
        if batch is None or self.down:
            return  # down: the write fails, the cursor stays
        for r in batch.records:
            if r.request_id not in self.database:
                self.database[r.request_id] = r
                self.insert_order.append(r.request_id)
        self.s.commit(batch)

    @rule()
    def database_down(self) -> None:
        self.down = True

    @rule()
    def database_up(self) -> None:
        self.down = False

    @rule(torn=st.booleans())
    def crash_and_restart(self, torn: bool) -> None:
        crashed = self._new_dir()
        shutil.copytree(self.directory, crashed)  # what the killed process leaves on disk
        self.s.close()
        if torn and segments(crashed):
            with segments(crashed)[-1].open("ab") as f:
                f.write(b'{"v":1,"request_id":"torn')
        self.directory = crashed
        self.spool = UsageSpool(crashed, segment_bytes=700)
        self.spool.open()

    @invariant()
    def stored_once_in_append_order(self) -> None:
        if self.spool is not None:
            assert self.insert_order == self.appended[: len(self.insert_order)]

    def teardown(self) -> None:
        if self.spool is None:
            return
        self.down = False
        self.s.sync()
        for _ in range(1000):
            if self.s.num_pending == 0:
                break
            self.flush(1000)
        assert self.insert_order == self.appended  # nothing lost, nothing twice, in order
        assert self.s.read(1000) is None
        assert len(segments(self.directory)) <= 1  # committed segments are deleted
        self.s.close()
        assert segments(self.directory) == []


def test_spool_state_machine(tmp_path: Path) -> None:
    run_state_machine_as_test(
        lambda: SpoolMachine(tmp_path),
        settings=settings(max_examples=40, stateful_step_count=30, deadline=None),
    )
