"""Running an app on uvicorn with a graceful SIGTERM/SIGINT drain.

On the first signal: the app starts draining (new generation requests get 503, `/ready` fails),
uvicorn closes the listening socket and idle connections, and in-flight responses (streams
included) run on for up to `shutdown_grace_s`; past that they are cancelled, which aborts their
engine requests. Then the lifespan shutdown stops the engine and the process exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from weir.gateway.http.header_guard import HeaderGuardProtocol
from weir.gateway.server.state import GatewayState
from weir.gateway.settings.settings import LogLevel, Settings

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
KEEP_ALIVE_TIMEOUT_S = 5


class DrainingServer(uvicorn.Server):
    """A uvicorn server that tells the app to drain when a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.state.draining:
            logger.info("signal %d: draining; in-flight requests may finish", sig)
        self.state.begin_drain()
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn re-raises the caught signal after its graceful shutdown so the default action
    (death by signal) follows; a drained server should exit 0 instead, so catch that re-raise."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda s, f: None) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def uvicorn_config(app: Starlette, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration for `weir serve`."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_level=settings.log_level.value,
        # The access log costs a line of formatting per request; keep it for debugging only.
        access_log=settings.log_level is LogLevel.DEBUG,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # None would wait forever
        server_header=False,
        # X-Forwarded-* only from the configured proxies: uvicorn's own default trusts loopback,
        # which let any local client pick the address it is throttled and logged as.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=list(settings.forwarded_allow_ips),
        # Input bounds (docs/security.md): headers still arriving past MAX_HEADER_BYTES, or for
        # longer than its header timeout, close the connection before the app sees them
        # (HeaderGuardProtocol; BodyLimitMiddleware answers 431 for those that arrive at once); an
        # idle keep-alive connection closes after KEEP_ALIVE_TIMEOUT_S.
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S,
        # httptools (llhttp) with those bounds, never h11: h11 frames every streamed chunk in
        # Python on the event loop's one thread (docs/decisions.md).
        http=HeaderGuardProtocol,
        # asyncio always: uvicorn's "auto" takes uvloop where it is installed, which measured more
        # server CPU per request here (docs/decisions.md).
        loop="asyncio",
    )


@contextlib.contextmanager
def gil_switch_interval(seconds: float) -> Iterator[None]:
    """The process's GIL switch interval set to `seconds` while serving, restored after.

    The engine thread steps in torch ops that each release the GIL and take it back (~600 a
    decode step of a 30-layer model). While the event loop runs Python (SSE chunks, parsing,
    admission), a retake waits until the loop's thread is asked to drop the GIL, which CPython
    does after the switch interval, 5 ms by default: a busy front end then stretches every step.
    Measured beside batch-8 decode steps of SmolLM2 with a thread busy 60% of the time in pure
    Python (`weir_bench.experiments.gil_contention`, one intra-op thread): 5 ms -> 0.5 ms took the
    step from 2.7x to 1.7-1.95x its time alone, the busy thread doing as much work
    (docs/benchmarks.md). The cost is more frequent switches between Python threads.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def run_server(app: Starlette, settings: Settings, sock: socket.socket | None = None) -> int:
    """Serve until a signal drains the server; the exit status (0 after a clean drain).

    `sock`: an already bound socket (tests bind port 0 and read the port before serving).
    """
    state: GatewayState = app.state.gateway
    server = DrainingServer(uvicorn_config(app, settings), state)
    with _signals_end_quietly(), gil_switch_interval(settings.gil_switch_interval_ms / 1e3):
        server.run(sockets=[sock] if sock is not None else None)
    # uvicorn leaves `started` False when startup (e.g. the lifespan) failed.
    return 0 if server.started else 1
