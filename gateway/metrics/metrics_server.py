"""The operator's metrics listener: `/metrics` on its own port, away from the API.

The metrics name every tenant and its traffic, so the API port serves them only with the admin
token; Prometheus scrapes this listener instead (`--metrics-port`, default 9464, 0: none). It
binds the same host as the API: in Kubernetes the scraper reaches the pod's address, and a
NetworkPolicy or the Service (never the Ingress) decides who else may. It runs as a second
uvicorn server on the API server's event loop, started and stopped by the app's lifespan, so it
adds no thread and no process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from weir.gateway.http.errors import NotFoundError, error_response
from weir.gateway.http.header_guard import HeaderGuardProtocol
from weir.gateway.metrics.registry import GatewayMetrics

logger = logging.getLogger(__name__)


def metrics_app(metrics: GatewayMetrics) -> Starlette:
    """A bare app answering `GET /metrics` (anything else: an OpenAI-shaped 404)."""

    async def scrape(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(NotFoundError(f"no route {request.url.path} on the metrics port"))

    return Starlette(routes=[Route("/metrics", scrape, methods=["GET"])], exception_handlers={404: not_found})


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the API server it runs beside."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class MetricsListener:
    """`/metrics` on host:port, served from the running event loop between `start` and `stop`."""

    def __init__(
        self, metrics: GatewayMetrics, host: str, port: int, sock: socket.socket | None = None
    ) -> None:
        config = uvicorn.Config(
            metrics_app(metrics),
            host=host,
            port=port,
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            http=HeaderGuardProtocol,
        )
        self._server = _QuietServer(config)
        self._sock = sock
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for); 0 before `start`."""
        return 0 if self._sock is None else int(self._sock.getsockname()[1])

    async def start(self) -> None:
        """Bind and serve; an OSError if the port cannot be bound (start-up then fails)."""
        if self._sock is None:
            # Bound here rather than by uvicorn, whose bind failure is a sys.exit inside the loop.
            self._sock = _bind(self._server.config.host, self._server.config.port)
        self._task = asyncio.create_task(self._server.serve([self._sock]), name="weir-metrics")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raises the bind error
                raise RuntimeError("the metrics listener stopped during start-up")
            await asyncio.sleep(0.01)
        logger.info("metrics on http://%s:%d/metrics", self._server.config.host, self.port)

    async def stop(self) -> None:
        """Close the listener (after the API drained: the last scrape still sees the final counts)."""
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._task = None
