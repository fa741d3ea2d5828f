"""SIGTERM during a stream: the stream finishes, new connections are refused, exit status 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.harness import MODEL, wait_until

ROOT = Path(__file__).resolve().parents[2]


class FakeServer:
    """The fake server subprocess and the lines it printed."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.fake_server", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert wait_until(lambda: any(line.startswith("PORT ") for line in self.lines), 60), self.lines
        self.port = int(next(line for line in self.lines if line.startswith("PORT "))[5:])
        self.url = f"http://127.0.0.1:{self.port}"
        assert wait_until(lambda: self._ready(), 30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready").status_code == 200
        except httpx.TransportError:
            return False

    def refuses_connections(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return False
        except OSError:
            return True

    def line(self, prefix: str) -> str:
        return next(line[len(prefix) :] for line in self.lines if line.startswith(prefix))


@pytest.fixture
def start() -> Iterator[type[FakeServer]]:
    servers: list[FakeServer] = []

    def factory(*args: str) -> FakeServer:
        server = FakeServer(*args)
        servers.append(server)
        return server

    yield factory  # type: ignore[misc]
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def stream_events(url: str, max_tokens: int, on_first: object) -> list[str]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    events = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:
                    on_first()  # type: ignore[operator]
    return events


def test_sigterm_lets_the_stream_finish_and_exits_0(start: type[FakeServer]) -> None:
    server = start("--token-delay-s", "0.05", "--grace-s", "30")
    refused_during_stream: list[bool] = []

    def on_first() -> None:
        server.proc.send_signal(signal.SIGTERM)
        # The listener closes while the stream is still running.
        refused_during_stream.append(wait_until(server.refuses_connections, 10))

    events = stream_events(server.url, 30, on_first)
    assert events[-1] == "[DONE]"
    finish = json.loads(events[-2])["choices"][0]
    assert finish["finish_reason"] == "length"
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2]]
    assert len([c for c in contents if c]) == 30
    assert refused_during_stream == [True]
    assert server.proc.wait(timeout=30) == 0
    assert server.line("ABORTED ") == "-"
    assert server.line("FREE ") == "256/256"


@pytest.mark.slow
def test_streams_past_the_grace_period_are_cut_and_aborted(start: type[FakeServer]) -> None:
    server = start("--token-delay-s", "0.05", "--grace-s", "1")
    events = stream_events(server.url, 250, lambda: server.proc.send_signal(signal.SIGTERM))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]  # cut short, with the reason
    assert error["code"] == "shutting_down"
    assert server.proc.wait(timeout=30) == 0
    assert server.line("ABORTED ").startswith("chatcmpl-")
    assert server.line("FREE ") == "256/256"
