"""uvicorn's httptools protocol with two bounds on request headers that are still arriving.

uvicorn bounds the idle time between keep-alive requests, but nothing else about a request's
line and headers before the app sees them:

- **Time (slowloris):** a client that opens a connection and sends nothing, or dribbles one
  header byte every few seconds, would hold its connection (and a file descriptor) forever.
  Here every request's line and headers must finish arriving within `header_timeout_s` of its
  first byte (or of the connection being made); otherwise the connection is closed. No response
  can be sent: there is no request to answer yet. The body has its own deadline in
  `weir.gateway.http.body_limit` (408).
- **Size:** httptools buffers a header until its line ends, then hands it to the protocol,
  which keeps every header; a header line that never ends would grow without limit. Past `MAX_HEADER_BYTES`
  received before the headers are complete, the connection gets a 400 and is closed. (Headers
  that arrive whole are bounded in the app, with a 431: `weir.gateway.http.body_limit`.)

httptools (llhttp, the C parser Node.js uses) replaced h11 here: h11 parses and frames every
message in Python, which cost the event loop's one thread most of its time per streamed token
(docs/decisions.md has the measurement).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from weir.gateway.http.body_limit import MAX_HEADER_BYTES

HEADER_TIMEOUT_S = 15.0


class HeaderGuardProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that closes a connection whose request headers take too long to arrive
    or grow past `max_header_bytes` before they are complete."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._awaiting_headers = True  # from a message's first byte to its headers' end
        self._header_bytes = 0
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Counted after parsing: a chunk that completes the headers (and carries a body) is never
        # counted; one that leaves them incomplete counts whole.
        if self._awaiting_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._disarm()
                self.logger.info(
                    "closing a connection whose request headers exceed %d bytes", self.max_header_bytes
                )
                self.send_400_response("Request headers too large.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._header_bytes = 0
        if self._header_deadline is None:
            self._arm()  # a keep-alive connection's next request: its deadline starts now

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._on_timeout)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_timeout(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request headers took over %.0f s", self.header_timeout_s
            )
            self.transport.close()
