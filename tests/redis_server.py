"""A real redis-server (Debian's `redis-server`; Valkey's `valkey-server` speaks the same) on a
free 127.0.0.1 port with a temporary directory, for the KV store tier's tests.

`.ci/run` installs it; a machine without the binary skips these tests with that reason. The
server persists nothing (no RDB, no AOF) and is stopped (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def _binary() -> str | None:
    return shutil.which("redis-server") or shutil.which("valkey-server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A running store: its URL, port and process (tests pause, stop or reconfigure it)."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, password: str | None = None):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=password, socket_timeout=5)

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def run_redis_server(directory: Path) -> Iterator[RedisServer]:
    """Start a store in `directory`; skips the calling test when no server binary is installed."""
    binary = _binary()
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    for _ in range(5):  # the port may be taken between choosing and binding it
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        server = RedisServer(proc, port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if server.client().ping():
                    break
            except Exception:
                time.sleep(0.05)
        if proc.poll() is None:
            try:
                yield server
            finally:
                server.stop()
            return
    raise RuntimeError("redis-server did not start")
