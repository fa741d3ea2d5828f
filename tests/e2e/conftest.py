"""A real uvicorn server on an ephemeral 127.0.0.1 port over the fake engine, and clients for it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app, serve_in_thread


@dataclass
class Server:
    engine: FakeEngine
    url: str


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    engine = FakeEngine()
    with serve_in_thread(make_app(engine)) as url:
        yield Server(engine, url)


@pytest.fixture
def fake(server: Server) -> FakeEngine:
    server.engine.reset()
    return server.engine


@pytest.fixture
def client(server: Server, fake: FakeEngine) -> Iterator[openai.OpenAI]:
    # No retries: a 500/503 must surface, not be retried into a pass.
    with openai.OpenAI(base_url=server.url + "/v1", api_key="test-key", max_retries=0) as c:
        yield c


@pytest.fixture
def http(server: Server, fake: FakeEngine) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c
