"""The server side of `weir bench overhead`: the real gateway over the null engine, in its own process.

Built the way `weir serve` builds it (`weir.gateway.server.bootstrap`): the SQLite tenancy database with its
admin routes, admission control (on by default, as in `weir serve`), the same auth mode wiring
(API keys and the batched usage writer in `keys` mode),
the real tokenizer and chat template of a model folder, and `weir.gateway.server.uvicorn_runner.run_server` (the
same uvicorn configuration, access log off). Only the engine is replaced, by `NullEngine`.

The app is wrapped in `TimedApp`, which records how long each HTTP request spent inside the
ASGI app (first call to last body byte handed to uvicorn). `GET /_bench/timings` returns and
optionally clears those figures; it is not timed itself.

Run by the benchmark, not by hand: `python -m weir_bench.overhead_server --model DIR --data-dir DIR
--auth none|keys`. Prints one JSON line, `{"port": N, "admin_token": "..."}`, once listening.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from weir_bench.null_engine import NullEngine

if TYPE_CHECKING:
    from weir.gateway.fleet.model_fleet import ModelFleet
    from weir.gateway.prompts.tokenization import Tokenizer
    from weir.gateway.settings.settings import Settings

MODEL_NAME = "null-model"
MAX_MODEL_LEN = 8192  # SmolLM2's context; only bounds max_tokens checks here
TIMINGS_PATH = "/_bench/timings"
SHUTDOWN_GRACE_S = 2.0


class Timings:
    """Per path, ms from the app call to its final body message, since the last reset."""

    def __init__(self) -> None:
        self.by_path_ms: dict[str, list[float]] = {}

    def record(self, path: str, ms: float) -> None:
        self.by_path_ms.setdefault(path, []).append(ms)

    async def endpoint(self, request: Request) -> Response:
        """`GET /_bench/timings[?reset=1]`: `{path: [ms, ...]}`."""
        body = self.by_path_ms
        if request.query_params.get("reset"):
            self.by_path_ms = {}
        return JSONResponse(body)

    def route(self) -> BaseRoute:
        return Route(TIMINGS_PATH, self.endpoint, methods=["GET"])


class TimedApp:
    """An ASGI wrapper that times every HTTP request except the timings route itself."""

    def __init__(self, app: Any, timings: Timings) -> None:
        self.app = app
        self.state = app.state  # run_server reads app.state.gateway to drain on SIGTERM
        self.timings = timings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == TIMINGS_PATH:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope["path"]

        async def timed_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.timings.record(path, (time.perf_counter() - start) * 1000.0)

        await self.app(scope, receive, timed_send)


def _load_tokenizer(model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model), local_files_only=True)


def served_fleet(engine: NullEngine, tokenizer: Tokenizer, settings: Settings) -> ModelFleet:
    """The one-version fleet the server serves the null engine from, ready as `weir serve`'s fleet
    makes a version it loads: the tokenizer pool workers' private copies made before serving,
    not on a worker's first busy moment (a ~65 ms GIL hold each, a stall of every request then)."""
    from weir.gateway.fleet.fleet_types import model_fingerprint
    from weir.gateway.fleet.model_fleet import single_engine_fleet

    fleet = single_engine_fleet(
        MODEL_NAME,
        engine,
        tokenizer,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=len(tokenizer),
        fingerprint=model_fingerprint(MODEL_NAME, MAX_MODEL_LEN, settings.resolved_dtype("cpu")),
    )
    for version in fleet.versions():
        assert version.prompts is not None
        version.prompts.make_copies(settings.tokenizer_workers)
    return fleet


def main(argv: list[str] | None = None) -> int:
    """Build the app, bind 127.0.0.1:0, print the port and admin token, serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m weir_bench.overhead_server")
    parser.add_argument("--model", type=Path, required=True, help="a folder with the tokenizer")
    parser.add_argument("--data-dir", type=Path, required=True, help="SQLite database goes here")
    parser.add_argument("--auth", choices=["none", "keys"], default="none")
    parser.add_argument("--output-tokens", type=int, default=16, help="tokens per choice")
    parser.add_argument("--admission", choices=["on", "off"], default="on", help="as weir serve (default on)")
    parser.add_argument(
        "--gil-switch-interval-ms", type=float, default=None, help="as weir serve (default: its default)"
    )
    args = parser.parse_args(argv)

    from weir.gateway.admission.controller import build_admission
    from weir.gateway.fleet import gc_pauses
    from weir.gateway.metrics.admission_metrics import AdmissionMetrics
    from weir.gateway.metrics.registry import GatewayMetrics
    from weir.gateway.server.app import create_app
    from weir.gateway.server.bootstrap import build_tenancy
    from weir.gateway.server.uvicorn_runner import run_server
    from weir.gateway.settings.settings import AuthMode, LogLevel, Settings
    from weir.tenancy.keys.keys import generate_admin_token

    tokenizer = _load_tokenizer(args.model)
    admin_token = generate_admin_token()
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and accepted sockets inherit it. Without it, Nagle holds the body write of every
    # keep-alive response until the client's delayed ACK, about 40 ms later.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(
        host="127.0.0.1",
        port=port,
        data_dir=args.data_dir,
        cache_dir=args.data_dir,
        auth=AuthMode(args.auth),
        admission=args.admission == "on",
        admin_token=admin_token,
        served_model_name=MODEL_NAME,
        shutdown_grace_s=SHUTDOWN_GRACE_S,
        log_level=LogLevel.WARNING,
    )
    if args.gil_switch_interval_ms is not None:  # else the settings' default, as `weir serve`'s
        settings = dataclasses.replace(settings, gil_switch_interval_ms=args.gil_switch_interval_ms)
    # As `weir serve` does: tenancy (database, admin routes) always; admission unless turned off;
    # keys and usage records in keys mode.
    tenancy = build_tenancy(settings)
    engine = NullEngine(num_tokens=args.output_tokens, token_id=tokenizer.eos_token_id or 0)
    timings = Timings()
    startup: list[Callable[[], Awaitable[None]]] = []
    shutdown: list[Callable[[], Awaitable[None]]] = []
    if tenancy.start is not None:
        startup.append(tenancy.start)
    if tenancy.close is not None:
        shutdown.append(tenancy.close)
    kwargs: dict[str, Any] = {}
    metrics = GatewayMetrics(engine.stats)
    if settings.admission:
        admission = build_admission(settings, engine.stats, AdmissionMetrics(metrics.registry))
        startup.append(admission.start)
        shutdown.append(admission.close)
        kwargs["admission"] = admission
    if settings.auth_mode is AuthMode.KEYS:
        kwargs["authenticate"] = tenancy.authenticate
        kwargs["usage_sink"] = tenancy.usage_sink
        kwargs["usage_journal"] = tenancy.usage_journal  # a stream's durable first record, as served
        kwargs["response_store"] = tenancy.response_store  # stored /v1/responses, in SQLite, as served
    freeze_start, freeze_stop = gc_pauses.lifespan_hooks(metrics.registry, True)  # last, as `weir serve`
    startup.append(freeze_start)
    shutdown.append(freeze_stop)
    fleet = served_fleet(engine, tokenizer, settings)
    app = create_app(
        settings,
        None,
        None,
        fleet=fleet,
        metrics=metrics,
        extra_routes=[*tenancy.routes, timings.route()],
        on_startup=startup,
        on_shutdown=shutdown,
        **kwargs,
    )
    timed = TimedApp(app, timings)
    print(json.dumps({"port": port, "admin_token": admin_token}), flush=True)
    return run_server(timed, settings, sock)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
