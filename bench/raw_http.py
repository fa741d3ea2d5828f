"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for load that must cost little.

The gateway-overhead benchmark runs client and server on the same two cores. httpx spends more
than a millisecond of CPU per request, as much as the server under test, and once the client
falls behind, its pool grows and each request costs more still. This client sends prebuilt
request bytes on pooled connections and reads the response with a few `readuntil` calls:
status line, headers, then a `Content-Length` body or a chunked one. Nothing else of HTTP
(redirects, compression, proxies, TLS) is supported; it is not a general client.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

_MAX_HEAD_BYTES = 64 * 1024


class HTTPProtocolError(Exception):
    """The server's answer is not HTTP/1.1 as this client reads it, or the connection broke."""


class _StaleConnection(Exception):
    """The connection closed before the first byte of the answer."""


@dataclass(frozen=True)
class RawResponse:
    """Status, the whole (de-chunked) body, and when its first byte was read (perf_counter)."""

    status_code: int
    body: bytes
    first_body_s: float | None = None


def build_request(method: str, host: str, path: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """The bytes of one HTTP/1.1 request (keep-alive is the default in 1.1)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class RawClient:
    """Pooled keep-alive connections to one host and port; not bounded (open-loop load)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Connection] = []

    async def request(self, raw_request: bytes) -> RawResponse:
        """Send prebuilt request bytes, return the response; OSError/HTTPProtocolError on failure.

        A pooled connection the server closed while idle (keep-alive timeout) fails before any
        byte of the answer; that request is sent again once, on a new connection.
        """
        if self._idle:
            try:
                return await self._exchange(self._idle.pop(), raw_request)
            except _StaleConnection:
                pass
        try:
            return await self._exchange(await self._connect(), raw_request)
        except _StaleConnection as exc:
            raise HTTPProtocolError("connection closed before a response") from exc

    async def _exchange(self, conn: _Connection, raw_request: bytes) -> RawResponse:
        try:
            conn.writer.write(raw_request)
            await conn.writer.drain()
            response, keep_alive = await self._read_response(conn.reader)
        except asyncio.IncompleteReadError as exc:
            conn.close()
            raise HTTPProtocolError("connection closed mid-response") from exc
        except (asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            raise HTTPProtocolError(f"malformed response: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        if keep_alive:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def aclose(self) -> None:
        """Close every idle connection."""
        while self._idle:
            self._idle.pop().close()

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    async def _read_response(self, reader: asyncio.StreamReader) -> tuple[RawResponse, bool]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _StaleConnection from exc
            raise
        except ConnectionResetError as exc:
            raise _StaleConnection from exc
        if len(head) > _MAX_HEAD_BYTES:
            raise HTTPProtocolError("response head too long")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HTTPProtocolError(f"bad status line {status_line!r}")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        first_body_s: float | None = None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, first_body_s = await self._read_chunked(reader)
        elif "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
            first_body_s = time.perf_counter()
        else:
            raise HTTPProtocolError("response has neither Content-Length nor chunked encoding")
        keep_alive = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        return RawResponse(int(parts[1]), body, first_body_s), keep_alive

    async def _read_chunked(self, reader: asyncio.StreamReader) -> tuple[bytes, float | None]:
        parts: list[bytes] = []
        first_s: float | None = None
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers (none expected) end with an empty line.
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return b"".join(parts), first_s
            parts.append(await reader.readexactly(size))
            if first_s is None:
                first_s = time.perf_counter()
            if await reader.readexactly(2) != b"\r\n":
                raise HTTPProtocolError("chunk not followed by CRLF")
