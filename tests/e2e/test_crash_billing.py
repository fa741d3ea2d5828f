"""Issue 21 item 4 end to end: a stream cut by a server crash is billed for what it delivered.

A real `weir serve` (a child process, tiny random model, keys on) streams a long completion; after
9 chunks, once the stream's provisional usage record is in the usage spool, the server is killed
with SIGKILL. Started again on the same data directory, it replays the spool, and the database
holds the request's record: cancelled, the whole prompt and at least the 9 tokens delivered.
Before the fix the stream had no usage record at all: records were written only at the end.

Issue 54 finding 8 (`weir_bench.experiments.crash_billing`): streams that finished just before the
kill (the client had `[DONE]`) are stored `completed` with the exact counts their clients got,
and streams cut by it are billed no more than they delivered and at least what they had
delivered well before the kill. Before the fix the finished ones were stored as `cancelled`
from a provisional record, and the cut ones were billed ~1 s of tokens short.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import wait_until
from weir.tenancy.usage.usage_codec import CorruptRecordError, decode_record
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir_bench.experiments.crash_billing import run_crash
from weir_bench.weir_process import run_weir

pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_TOKENS = 8000
FLAGS = ["--served-model-name", MODEL, "--device", "cpu", "--kv-cache-tokens", "16384"]


def _spooled(data: Path, request_id: str) -> list[UsageRecordIn]:
    """The request's records in the usage spool, in the order written."""
    found = []
    for segment in sorted((data / "usage-spool").glob("seg-*.jsonl")):
        for line in segment.read_bytes().splitlines(keepends=True):
            try:
                record = decode_record(line)
            except CorruptRecordError:
                continue
            if record.request_id == request_id:
                found.append(record)
    return found


def _stored(data: Path, request_id: str) -> tuple[str, int, int] | None:
    with sqlite3.connect(data / "weir.db") as conn:
        row = conn.execute(
            "SELECT status, prompt_tokens, completion_tokens FROM usage_records WHERE request_id = ?",
            (request_id,),
        ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def test_a_stream_cut_by_kill_9_is_billed_from_the_spool_after_the_restart(tmp_path: Path) -> None:
    weights = make_tiny_model(tmp_path / "model", arch="llama", num_kv_heads=2, max_position_embeddings=8192)
    data = tmp_path / "data"
    with run_weir(weights, data, FLAGS) as server:
        admin = {"authorization": f"Bearer {server.admin_token}"}
        assert (
            httpx.post(server.url + "/admin/v1/tenants", json={"name": "acme"}, headers=admin).status_code
            == 201
        )
        key = httpx.post(server.url + "/admin/v1/tenants/acme/keys", json={}, headers=admin).json()["key"]
        body = {"model": MODEL, "prompt": "a stream cut by a crash", "max_tokens": MAX_TOKENS, "stream": True}
        body["ignore_eos"] = True
        headers = {"authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60
        ) as r:
            assert r.status_code == 200
            chunks = []
            lines = r.iter_lines()  # kept open: the client stays connected, only the server dies
            while len(chunks) < 9:
                line = next(lines)
                if line.startswith("data: {"):
                    chunks.append(json.loads(line.removeprefix("data: ")))
            request_id = chunks[0]["id"]
            # The provisional record was on disk before the first byte; wait for one that covers
            # the 9 chunks read (the stream goes on meanwhile), then crash.
            assert wait_until(
                lambda: any(rec.completion_tokens >= 9 for rec in _spooled(data, request_id)), 30
            ), _spooled(data, request_id)
            server.proc.send_signal(signal.SIGKILL)
            assert server.proc.wait(timeout=30) == -signal.SIGKILL
            lines.close()
    spooled = _spooled(data, request_id)
    assert spooled and spooled[0].status.value == "cancelled"
    num_prompt = spooled[0].prompt_tokens
    assert num_prompt > 0
    with run_weir(weights, data, FLAGS):
        assert wait_until(lambda: _stored(data, request_id) is not None, 30)
        status, prompt_tokens, completion_tokens = _stored(data, request_id) or ("", 0, 0)
    assert status == "cancelled"
    assert prompt_tokens == num_prompt
    assert 9 <= completion_tokens < MAX_TOKENS  # what it delivered, not what it was allowed


def test_streams_finished_before_kill_9_are_completed_and_cut_ones_billed_what_they_delivered(
    tmp_path: Path,
) -> None:
    weights = make_tiny_model(tmp_path / "model", arch="llama", num_kv_heads=2, max_position_embeddings=8192)
    bills = run_crash(
        weights,
        tmp_path / "data",
        num_cut=6,
        num_finished=3,
        flags=("--served-model-name", "crash", "--device", "cpu", "--kv-cache-tokens", "65536"),
    )
    finished = [b for b in bills if b.kind == "finished"]
    cut = [b for b in bills if b.kind == "cut"]
    assert len(finished) == 3 and len(cut) == 6
    for b in finished:  # the client read `[DONE]` just before the kill
        assert b.status == "completed", b
        assert b.billed == b.delivered == b.reported_tokens == 12, b
    for b in cut:
        assert b.status == "cancelled", b
        assert b.billed is not None and b.billed <= b.delivered, b  # never what it did not deliver
        # What it had delivered before the checkpoint, which was 2 s (8 progress intervals) before
        # the kill, is billed: the records went on being written after it.
        assert b.billed >= b.checkpoint > 0, b
