"""A real `AsyncEngine` behind `create_app`, served by uvicorn on 127.0.0.1 in a thread.

The end-to-end tests that need the real engine (not the fake one) with a given `EngineConfig`
(a swap-constrained pool, a drafter, ...) share this one helper rather than each building the
app by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.gateway.harness import check_admin_token, serve_in_thread
from weir.engine.async_engine import AsyncEngine
from weir.engine.config import EngineConfig
from weir.gateway.server.app import create_app
from weir.gateway.settings.settings import Settings

TINY_MODEL_NAME = "tiny-llama"


@dataclass(frozen=True)
class RealServer:
    """A served engine and the base URL of its server."""

    engine: AsyncEngine
    url: str


@contextlib.contextmanager
def serve_engine(
    config: EngineConfig, model_name: str = TINY_MODEL_NAME, **app_kwargs: Any
) -> Iterator[RealServer]:
    """Build the engine from `config`, serve it (without tenancy unless `app_kwargs` bring an
    authenticator and stores for `create_app`); stops both on exit."""
    engine = AsyncEngine(config)
    app = create_app(
        Settings(),
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=model_name,
        vocab_size=engine.model_config.vocab_size,
        on_startup=[engine.start],
        on_shutdown=[engine.shutdown],
        metrics_auth=check_admin_token,
        **app_kwargs,
    )
    with serve_in_thread(app) as url:
        yield RealServer(engine, url)
