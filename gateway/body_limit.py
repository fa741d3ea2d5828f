"""ASGI middleware that refuses request bodies over a size limit with a 413.

A declared `Content-Length` over the limit is refused before anything is read; a body without
one (chunked) is counted while it is read, and the read fails once it passes the limit.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PayloadTooLargeError


class BodyLimitMiddleware:
    """Wraps an ASGI app; `max_body_bytes` applies to every HTTP request."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _error(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body is larger than {self.max_body_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_body_bytes:
                    await self._refuse(send)
                    return
                break
        limit = self.max_body_bytes
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the endpoint's body read; the app's error handler answers 413.
                    raise self._error()
            return message

        await self.app(scope, counting_receive, send)

    async def _refuse(self, send: Send) -> None:
        error = self._error()
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": body})
