"""`weir serve`: build the engine, the tenancy pieces and the app from Settings, then serve.

Heavy imports (torch, the engine, SQLAlchemy) happen inside these functions, so `weir --help`
and the other subcommands start fast.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.routing import BaseRoute

from gateway.accounting import UsageSink
from gateway.app import create_app
from gateway.routes.openai import Authenticate
from gateway.server import run_server
from gateway.settings import AuthMode, LogLevel, Settings

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

logger = logging.getLogger("weir.serve")

# The engine keeps one block back (the null block), so a pool of N tokens needs one more block.
_RESERVED_BLOCKS = 1


def configure_logging(level: LogLevel) -> None:
    """Plain logging to stderr at `level` (uvicorn configures its own loggers)."""
    logging.basicConfig(
        level=level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def resolve_model_path(settings: Settings) -> Path:
    """`--model`, or the default SmolLM2 prepared into the cache (converted once if missing)."""
    if settings.model_path is not None:
        return settings.model_path
    from engine.model_prepare import ensure_default_model

    return ensure_default_model(settings.cache_dir)


def resolve_device(settings: Settings) -> str:
    """`--device`, else cuda when available, else cpu."""
    if settings.device:
        return settings.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_config(settings: Settings, model_path: Path, device: str) -> EngineConfig:
    """The EngineConfig for these settings."""
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.loader import load_model_config

    dtype = settings.resolved_dtype(device)
    block_size = CacheConfig().block_size
    num_blocks = None
    if settings.kv_cache_tokens is not None:
        num_blocks = math.ceil(settings.kv_cache_tokens / block_size) + _RESERVED_BLOCKS
    max_model_len = settings.max_model_len or load_model_config(model_path).max_model_len
    return EngineConfig(
        model_path=str(model_path),
        dtype=dtype,
        device=device,
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, kv_dtype=dtype),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
            max_model_len=max_model_len,
        ),
    )


@dataclass
class TenancyWiring:
    """What tenancy adds to the app: key checks, admin routes, usage records, a close hook."""

    authenticate: Authenticate | None = None
    usage_sink: UsageSink | None = None
    routes: list[BaseRoute] = field(default_factory=list)
    num_tenants: int = 0
    close: Callable[[], Awaitable[None]] | None = None


def build_tenancy(settings: Settings) -> TenancyWiring:
    """Open (and on SQLite, migrate) the database; build authenticators and admin routes.

    SQLite, the embedded default, is migrated at start so a fresh install just works; any other
    database must be migrated beforehand with `weir db upgrade`.
    """
    from gateway.auth import AdminAuthenticator, Authenticator
    from gateway.routes.admin import admin_routes
    from tenancy.bootstrap import admin_token_banner, ensure_admin_token
    from tenancy.db import Database
    from tenancy.keys import KeyHasher
    from tenancy.migrate import check_migrated, upgrade
    from tenancy.repo import TenancyRepo

    db = Database(settings.resolved_database_url)
    if db.backend == "sqlite":
        upgrade(db.engine)
    else:
        check_migrated(db.engine)
    repo = TenancyRepo(db, KeyHasher.from_pepper(settings.key_pepper))
    token = ensure_admin_token(repo, settings.admin_token)
    if token is not None:
        print(admin_token_banner(token), flush=True)  # shown once, never logged
    authenticator = Authenticator(repo)
    admin_auth = AdminAuthenticator(repo, settings.admin_token)

    async def close() -> None:
        db.dispose()

    return TenancyWiring(
        authenticate=authenticator.authenticate_async,
        routes=admin_routes(repo, authenticator, admin_auth),
        num_tenants=len(repo.list_tenants()),
        close=close,
    )


def resolve_auth(settings: Settings, num_tenants: int) -> AuthMode:
    """The auth mode: explicit, else `none` only for a fresh local install (see Settings)."""
    mode = settings.auth_mode
    if settings.auth is None and mode is AuthMode.NONE and num_tenants > 0:
        # Once an admin has created tenants, their keys must count, even on loopback.
        return AuthMode.KEYS
    return mode


def build_engine(settings: Settings) -> tuple[AsyncEngine, Path]:
    """Load the model (blocking) into a not yet started AsyncEngine."""
    from engine.async_engine import AsyncEngine

    model_path = resolve_model_path(settings)
    device = resolve_device(settings)
    config = engine_config(settings, model_path, device)
    logger.info("loading %s on %s (%s)", model_path, device, config.dtype)
    return AsyncEngine(config), model_path


def serve(settings: Settings) -> int:
    """`weir serve`: load, wire, serve until SIGTERM; the exit status."""
    configure_logging(settings.log_level)
    tenancy = build_tenancy(settings)
    auth = resolve_auth(settings, tenancy.num_tenants)
    if auth is AuthMode.NONE:
        logger.warning(
            "auth mode 'none': every request is served as the 'default' tenant, whatever key it sends "
            "(a fresh install on %s). Pass --auth keys to require API keys.",
            settings.host,
        )
    engine, model_path = build_engine(settings)
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = [engine.shutdown]
    if tenancy.close is not None:
        shutdown_hooks.append(tenancy.close)
    kwargs: dict[str, Any] = {}
    if auth is AuthMode.KEYS:
        kwargs["authenticate"] = tenancy.authenticate
        kwargs["usage_sink"] = tenancy.usage_sink
    app = create_app(
        settings,
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=settings.model_name(model_path),
        vocab_size=engine.model_config.vocab_size,
        extra_routes=tenancy.routes,
        on_startup=[engine.start],
        on_shutdown=shutdown_hooks,
        **kwargs,
    )
    return run_server(app, settings)
