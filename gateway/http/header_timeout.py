"""uvicorn's h11 protocol with a deadline on each request's line and headers (slowloris).

uvicorn bounds the *size* of headers still arriving (`h11_max_incomplete_event_size`) and the
idle time between keep-alive requests, but a client that opens a connection and sends nothing,
or dribbles one header byte every few seconds, holds its connection (and a file descriptor)
forever. Here every request must finish arriving its request line and headers within
`header_timeout_s` of its first byte (or of the connection being made); otherwise the
connection is closed. No response can be sent: h11 has no request to answer yet. The body has
its own deadline in `gateway.http.body_limit` (408).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 15.0


class HeaderTimeoutH11Protocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request headers take too long to arrive."""

    header_timeout_s: float = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and self._awaiting_headers():
            self._arm()
        super().data_received(data)
        if not self._awaiting_headers():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        """True while the next request's line and headers have not all arrived."""
        idle_cycle = self.cycle is None or self.cycle.response_complete
        return self.conn.their_state is h11.IDLE and idle_cycle

    def _arm(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._on_timeout)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_timeout(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request headers took over %.0f s", self.header_timeout_s
            )
            self.transport.close()
