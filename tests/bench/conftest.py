"""Fixtures of the bench tests: one scripted fake OpenAI server in a subprocess for the session.

A subprocess, not a thread: the server must not share the GIL with the client under test, or
its chunk timings would carry the client's scheduling noise.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from weir_bench.records import Outcome, RequestRecord

SERVER_SCRIPT = Path(__file__).with_name("fake_openai_server.py")


@dataclass(frozen=True)
class FakeServer:
    """Handle of the running fake server."""

    root: str  # http://127.0.0.1:PORT

    def url(self, mode: str = "ok", ttft_ms: int = 100, itl_ms: int = 20) -> str:
        """Base URL of one scripted behaviour."""
        return f"{self.root}/s/{mode}/{ttft_ms}/{itl_ms}"

    def log(self) -> list[dict[str, Any]]:
        """Every streamed request the server saw."""
        return httpx.get(f"{self.root}/_log", trust_env=False).json()

    def clear_log(self) -> None:
        httpx.delete(f"{self.root}/_log", trust_env=False)

    def wait_for(self, request_id: str, outcome: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """The log entry of a request once it has `outcome` (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while True:
            entries = [e for e in self.log() if e["request_id"] == request_id]
            if entries and entries[-1]["outcome"] == outcome:
                return entries[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"{request_id}: no {outcome!r} in {entries}")
            time.sleep(0.02)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeServer]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"fake server did not start: {line!r}")
        server = FakeServer(root=f"http://127.0.0.1:{int(line.split()[1])}")
        deadline = time.monotonic() + 20.0
        while True:
            try:
                httpx.get(f"{server.root}/v1/models", trust_env=False, timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        # Warm the server's first-request paths so no test's timings carry them.
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "stream": True,
        }
        httpx.post(f"{server.url('ok', 1, 1)}/v1/chat/completions", json=body, trust_env=False, timeout=5.0)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_records() -> list[RequestRecord]:
    """A small run of two tenants: completed, cancelled, and failed requests with known timings."""
    records = []
    for i in range(6):
        offsets = tuple(100.0 + 20.0 * k for k in range(5))  # TTFT 100, ITL 20, 5 tokens
        records.append(
            RequestRecord(
                request_id=f"r{i}", tenant="acme" if i % 2 == 0 else "globex", kind="chat", priority="interactive",
                max_tokens=5, scheduled_s=0.5 * i, start_s=0.5 * i, status_code=200, outcome=Outcome.OK,
                ttft_ms=offsets[0], e2e_ms=offsets[-1] + 1.0, chunk_offsets_ms=offsets,
                prompt_tokens=10 + i, completion_tokens=5, finish_reason="length",
            )
        )  # fmt: skip
    records.append(
        RequestRecord(
            request_id="c0", tenant="acme", kind="chat", priority=None, max_tokens=50, scheduled_s=1.0,
            start_s=1.0, status_code=200, outcome=Outcome.CANCELLED, ttft_ms=300.0, e2e_ms=340.0,
            chunk_offsets_ms=(300.0, 320.0, 340.0),
        )
    )  # fmt: skip
    for i, (status, outcome) in enumerate(
        [(500, Outcome.HTTP_ERROR), (429, Outcome.HTTP_ERROR), (0, Outcome.CONNECTION_ERROR)]
    ):
        records.append(
            RequestRecord(
                request_id=f"e{i}", tenant="globex", kind="completion", priority="batch", max_tokens=8,
                scheduled_s=2.0, start_s=2.0, status_code=status, outcome=outcome, error="x", e2e_ms=3.0,
            )
        )  # fmt: skip
    return records


@pytest.fixture
def sample_records() -> list[RequestRecord]:
    return make_records()
