"""bench.hostile.timed_stream: status, completion, TTFT and the answer's model version."""

from __future__ import annotations

import asyncio
import json

import httpx

from bench.hostile import StreamResult, timed_stream

_CHUNK = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}


def _run(handler: httpx.MockTransport) -> StreamResult:
    async def go() -> StreamResult:
        async with httpx.AsyncClient(transport=handler) as client:
            return await timed_stream(client, "http://weir", "sk", {"stream": True})

    return asyncio.run(go())


def test_a_complete_stream_reports_its_ttft_and_model_version() -> None:
    body = f"data: {json.dumps(_CHUNK)}\n\ndata: [DONE]\n\n".encode()
    transport = httpx.MockTransport(
        lambda _: httpx.Response(200, content=body, headers={"x-weir-model-version": "v2"})
    )
    result = _run(transport)
    assert (result.status, result.complete, result.model_version) == (200, True, "v2")
    assert result.ttft_s is not None


def test_a_refusal_keeps_its_status_and_version() -> None:
    transport = httpx.MockTransport(
        lambda _: httpx.Response(503, json={"error": {}}, headers={"x-weir-model-version": "v1"})
    )
    result = _run(transport)
    assert (result.status, result.complete, result.model_version) == (503, False, "v1")
