"""Slow or endless request headers close the connection (gateway/http/header_guard.py), through
real uvicorn."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app, serve_in_thread
from weir.gateway.http.header_guard import HeaderGuardProtocol
from weir.gateway.metrics.metrics_server import MetricsListener
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.server.uvicorn_runner import uvicorn_config
from weir.gateway.settings.settings import Settings

SHORT_TIMEOUT_S = 0.5


SMALL_HEADERS = 2048


class _ShortTimeout(HeaderGuardProtocol):
    header_timeout_s = SHORT_TIMEOUT_S
    max_header_bytes = SMALL_HEADERS


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    app = make_app(FakeEngine())
    config = uvicorn_config(app, dataclasses.replace(Settings(), host="127.0.0.1", port=0))
    assert config.http is HeaderGuardProtocol  # weir serve uses it
    config.http = _ShortTimeout
    with serve_in_thread(app, config) as url:
        parts = urlsplit(url)
        yield str(parts.hostname), int(parts.port or 0)


def _closed_by_server(sock: socket.socket) -> bool:
    """Wait (bounded by the socket timeout) for the server to close; True when it did."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_that_sends_nothing_is_closed(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=30) as sock:
        assert _closed_by_server(sock)


def test_headers_dribbled_past_the_deadline_close_the_connection(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # keep sending, but never finish the headers
            time.sleep(SHORT_TIMEOUT_S / 2)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        assert _closed_by_server(sock)


def test_prompt_requests_and_keep_alive_still_work(address: tuple[str, int]) -> None:
    host, port = address
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
        for _ in range(3):
            assert client.get("/health").status_code == 200
            time.sleep(SHORT_TIMEOUT_S * 1.5)  # idle between requests is the keep-alive timeout's job


def test_a_header_that_never_ends_gets_a_400_and_the_connection_closed(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nx-endless: ")
        with contextlib.suppress(OSError):  # the server may close while we still send
            for _ in range(2 * SMALL_HEADERS // 256):
                sock.sendall(b"a" * 256)
                time.sleep(0.005)
        response = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                response += chunk
    assert response.startswith(b"HTTP/1.1 400"), response[:100]


def test_headers_under_the_bound_sent_in_pieces_are_served(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=30) as sock:
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nx-pad: " + b"a" * (SMALL_HEADERS - 200) + b"\r\n\r\n"
        for i in range(0, len(head), 300):
            sock.sendall(head[i : i + 300])
            time.sleep(0.005)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_a_body_arriving_with_its_headers_is_not_counted_as_headers(address: tuple[str, int]) -> None:
    host, port = address
    body = b"x" * (8 * SMALL_HEADERS)  # far past the header bound, in the same writes as the headers
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
        r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 401, 422), r.text  # answered by the app, not cut off
        assert client.get("/health").status_code == 200  # and the keep-alive connection goes on


def test_the_metrics_listener_uses_it_too() -> None:
    listener = MetricsListener(GatewayMetrics(FakeEngine().stats), "127.0.0.1", 0)
    assert listener._server.config.http is HeaderGuardProtocol
