"""weir_bench.hostile.timed_stream: status, completion, TTFT and the answer's model version."""

from __future__ import annotations

import asyncio
import json

import httpx

from weir_bench.hostile import StreamResult, timed_stream

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


def test_gaps_between_content_chunks_are_the_itl() -> None:
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    events = [role_only, _CHUNK, _CHUNK, _CHUNK]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    result = _run(httpx.MockTransport(lambda _: httpx.Response(200, content=body.encode())))
    assert result.complete and result.ttft_s is not None
    assert len(result.itl_s) == 2 and all(gap >= 0 for gap in result.itl_s)  # 3 tokens, 2 gaps


def test_a_refusal_keeps_its_status_and_version() -> None:
    transport = httpx.MockTransport(
        lambda _: httpx.Response(503, json={"error": {}}, headers={"x-weir-model-version": "v1"})
    )
    result = _run(transport)
    assert (result.status, result.complete, result.model_version) == (503, False, "v1")


def test_the_floods_present_new_key_ids_or_the_victims() -> None:
    from weir.tenancy.keys.keys import parse_key
    from weir_bench.hostile import FLOODS, Target

    target = Target("http://127.0.0.1:1", "m", "sk-weir-x", 64, victim_key_id="v" * 16)
    random_ids, victim_id = FLOODS
    ids = set()
    for _ in range(5):
        path, headers, _body = random_ids.build(target)
        parsed = parse_key(headers["authorization"].removeprefix("Bearer "))
        assert path == "/v1/chat/completions" and parsed is not None
        ids.add(parsed.key_id)
    assert len(ids) == 5
    path, headers, _body = victim_id.build(target)
    assert path == "/v1/no-such-path" and headers["authorization"].startswith(
        "Bearer sk-weir-" + "v" * 16 + "-"
    )
