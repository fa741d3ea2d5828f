"""weir_bench.records: derived timings, error keys, JSONL round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir_bench.records import Outcome, RequestRecord, read_records, write_records


def rec(**kw: object) -> RequestRecord:
    base: dict = dict(
        request_id="r", tenant="t", kind="chat", priority=None, max_tokens=4, scheduled_s=0.0, start_s=1.0,
        status_code=200, outcome=Outcome.OK, ttft_ms=100.0, e2e_ms=160.0, chunk_offsets_ms=(100.0, 120.0, 160.0),
    )  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)


def test_itl_and_tpot_use_usage_counts() -> None:
    r = rec(completion_tokens=4)
    assert r.itl_ms == (20.0, 40.0)
    assert r.tpot_ms == pytest.approx(20.0)  # (160 - 100) / (4 - 1): usage, not chunks
    assert rec().tpot_ms == pytest.approx(30.0)  # no usage: 3 chunks
    assert rec(chunk_offsets_ms=(100.0,), e2e_ms=100.0).tpot_ms is None  # one token
    assert rec(outcome=Outcome.CANCELLED).tpot_ms is None
    assert rec(e2e_ms=1000.0).end_s == 2.0


def test_error_keys() -> None:
    assert rec().error_key is None and rec(outcome=Outcome.CANCELLED).error_key is None
    assert rec(status_code=503, outcome=Outcome.HTTP_ERROR).error_key == "503"
    assert rec(status_code=200, outcome=Outcome.CONNECTION_ERROR).error_key == "connection_error"
    assert rec(status_code=0, outcome=Outcome.TIMEOUT).error_key == "timeout"


def test_jsonl_round_trip(tmp_path: Path, sample_records: list[RequestRecord]) -> None:
    path = tmp_path / "requests.jsonl"
    write_records(sample_records, path)
    back = read_records(path)
    assert [(r.request_id, r.outcome, r.chunk_offsets_ms, r.completion_tokens) for r in back] == [
        (r.request_id, r.outcome, r.chunk_offsets_ms, r.completion_tokens) for r in sample_records
    ]
