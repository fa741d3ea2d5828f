"""Running a gateway app over the fake engine: on a real uvicorn in a thread, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.tiny_tokenizer import build_tokenizer
from weir.gateway.http.errors import AuthenticationError
from weir.gateway.server.app import create_app
from weir.gateway.settings.settings import Settings

MODEL = "tiny-model"
MAX_MODEL_LEN = 256


ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}


async def check_admin_token(authorization: str | None, client_addr: str) -> None:
    """A `metrics_auth` for test apps: only `ADMIN_HEADERS` may read /metrics on the API port."""
    if authorization != ADMIN_HEADERS["authorization"]:
        raise AuthenticationError("admin token required")


@functools.cache
def tokenizer() -> Any:
    """One tiny tokenizer for the whole test session (building it imports transformers)."""
    return build_tokenizer()


def make_app(engine: FakeEngine, settings: Settings | None = None, **kwargs: Any) -> Starlette:
    """`create_app` over the fake engine and the tiny tokenizer; kwargs go to create_app."""
    kwargs.setdefault("max_model_len", MAX_MODEL_LEN)
    kwargs.setdefault("model_name", MODEL)
    return create_app(settings or Settings(), engine, tokenizer(), **kwargs)


@contextlib.contextmanager
def serve_in_thread(app: Starlette, config: uvicorn.Config | None = None) -> Iterator[str]:
    """Serve `app` on an ephemeral port; yields the base URL, stops the server on exit.

    `config`: e.g. `weir.gateway.server.uvicorn_runner.uvicorn_config` with host 127.0.0.1 and port 0, to serve as
    `weir serve` does (forwarded headers, limits); by default a plain uvicorn configuration.
    """
    if config is None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_until(predicate: Any, timeout_s: float = 10.0) -> bool:
    """Poll `predicate` until true or the (generous) timeout passes; no timing is asserted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
