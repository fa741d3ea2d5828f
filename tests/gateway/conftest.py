"""Fixtures: a gateway app over the fake engine, served by uvicorn on 127.0.0.1 (one per module)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from starlette.applications import Starlette

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app, serve_in_thread


@dataclass
class Live:
    """A running server: its fake engine, app, base URL and an httpx client."""

    engine: FakeEngine
    app: Starlette
    url: str
    client: httpx.Client


@pytest.fixture(scope="module")
def live_server() -> Iterator[Live]:
    engine = FakeEngine()
    app = make_app(engine)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield Live(engine, app, url, client)


@pytest.fixture
def live(live_server: Live) -> Live:
    """The module's server with its fake engine reset to defaults."""
    live_server.engine.reset()
    return live_server
