"""413 for bodies over the limit: by Content-Length up front, and counted when chunked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread
from weir.gateway.settings.settings import Settings

LIMIT = 2048


@pytest.fixture(scope="module")
def small_server() -> Iterator[tuple[FakeEngine, httpx.Client]]:
    engine = FakeEngine()
    app = make_app(engine, Settings(max_request_body_bytes=LIMIT))
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        yield engine, client


def big_body() -> bytes:
    return b'{"model": "' + MODEL.encode() + b'", "prompt": "' + b"hello " * 1000 + b'"}'


def test_declared_length_over_the_limit(small_server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = small_server
    r = client.post("/v1/completions", content=big_body(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert engine.num_generate_calls == 0


def test_chunked_body_over_the_limit(small_server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = small_server
    body = big_body()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 512):
            yield body[i : i + 512]

    r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert engine.num_generate_calls == 0


def test_bodies_under_the_limit_pass(small_server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = small_server
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 1})
    assert r.status_code == 200
