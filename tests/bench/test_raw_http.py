"""The lean load client: Content-Length and chunked bodies, keep-alive reuse, stale connections."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from weir_bench.raw_http import HTTPProtocolError, RawClient, build_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            await reader.readexactly(int(line.split(":")[1]))
    return head


def _run(handler: Handler, scenario: Callable[[RawClient], Awaitable[None]]) -> list[int]:
    """Serve `handler` on 127.0.0.1:0 and run `scenario`; the number of connections accepted."""
    connections: list[int] = []

    async def main() -> None:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RawClient("127.0.0.1", port)
        try:
            await scenario(client)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
    return connections


REQUEST = build_request("POST", "h", "/x", {"content-type": "application/json"}, b"{}")


def test_build_request_sets_content_length() -> None:
    assert (
        REQUEST
        == b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    )


def test_content_length_and_chunked_bodies_on_one_kept_alive_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        await writer.drain()
        await reader.read()  # until the client closes

    async def scenario(client: RawClient) -> None:
        first = await client.request(REQUEST)
        second = await client.request(REQUEST)
        assert (first.status_code, first.body) == (200, b"hello")
        assert (second.status_code, second.body) == (201, b"abcde")
        assert second.first_body_s is not None

    assert len(_run(handler, scenario)) == 1


def test_a_connection_closed_while_idle_is_replaced() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()  # then close, as a keep-alive timeout would

    async def scenario(client: RawClient) -> None:
        for _ in range(3):
            assert (await client.request(REQUEST)).body == b"ok"

    assert len(_run(handler, scenario)) == 3


def test_connection_close_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def scenario(client: RawClient) -> None:
        await client.request(REQUEST)
        await client.request(REQUEST)

    assert len(_run(handler, scenario)) == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",  # neither length nor chunked
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # then closed
    ],
)
def test_malformed_answers_raise_protocol_errors(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def scenario(client: RawClient) -> None:
        with pytest.raises(HTTPProtocolError):
            await client.request(REQUEST)

    _run(handler, scenario)
