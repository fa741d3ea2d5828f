"""ASGI middleware that bounds requests: headers over a size limit 431, bodies over a size limit
413, bodies too slow to arrive 408.

The server's protocol (`weir.gateway.http.header_guard`) bounds headers that are still arriving, but
not headers that arrive at once; `max_header_bytes` bounds what reaches the app either way.

A declared `Content-Length` over the limit is refused before anything is read; a body without
one (chunked) is counted while it is read, and the read fails once it passes the limit.

A client that trickles its body (slowloris) would hold a connection, a request slot and its
buffers for as long as it likes: the whole body must arrive within `body_timeout_s` of the
request's headers, or the read fails with a 408.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weir.gateway.http.errors import (
    HeadersTooLargeError,
    PayloadTooLargeError,
    RequestTimeoutError,
    WeirError,
)

# 30 s for at most 8 MiB (the default body limit) is ~280 KB/s; a real client sends it at once.
BODY_TIMEOUT_S = 30.0
# The request line and headers, as uvicorn is configured (weir.gateway.server.uvicorn_runner); cookies and a bearer
# key fit many times over.
MAX_HEADER_BYTES = 16 * 1024


class BodyLimitMiddleware:
    """Wraps an ASGI app; `max_body_bytes` and `body_timeout_s` apply to every HTTP request."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_header_bytes: int = MAX_HEADER_BYTES,
        count_error: Callable[[int], None] | None = None,
    ) -> None:
        self.app = app
        self.count_error = count_error  # the error metric; errors raised later reach the app's handlers
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_header_bytes = max_header_bytes

    def _error(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body is larger than {self.max_body_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > self.max_header_bytes:
            await self._refuse(
                send, HeadersTooLargeError(f"request headers are larger than {self.max_header_bytes} bytes")
            )
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_body_bytes:
                    await self._refuse(send, self._error())
                    return
                break
        limit = self.max_body_bytes
        received = 0
        body_done = False
        deadline = time.monotonic() + self.body_timeout_s

        async def counting_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body only http.disconnect comes, whenever it comes
                return await receive()
            # Raised inside the endpoint's body read; the app's error handler answers 408 / 413.
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"the request body did not arrive within {self.body_timeout_s:g} s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self._error()
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, counting_receive, send)

    async def _refuse(self, send: Send, error: WeirError) -> None:
        if self.count_error is not None:
            self.count_error(error.status_code)
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": body})
