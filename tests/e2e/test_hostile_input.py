"""Hostile and careless input through the real HTTP server: always a 4xx with an OpenAI-shaped body,
naming the field, never a 500 (issue 10: defects 1 (API side) and 5, and the input bounds)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.e2e.tenancy_server import ADMIN, TENANT, FullServer, serve_everything
from tests.gateway.harness import MODEL, serve_in_thread
from weir.engine.sampling_bounds import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from weir.gateway.api.openai_bodies import requests as openai_bodies
from weir.gateway.api.openai_bodies.requests import MAX_PROMPTS
from weir.gateway.http.body_limit import MAX_HEADER_BYTES, BodyLimitMiddleware
from weir.gateway.http.errors import WeirError, error_response
from weir.gateway.http.header_guard import HeaderGuardProtocol
from weir.gateway.server.uvicorn_runner import uvicorn_config
from weir.gateway.settings.settings import Settings

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("hostile")) as server:
        yield server


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def post_raw(
    server: FullServer, path: str, body: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    h = {**(headers or server.tenant), "content-type": "application/json"}
    return httpx.post(server.url + path, content=body, headers=h, timeout=30)


# -- defect 1, API side: seeds the engine cannot take are refused up front --------------------------


@pytest.mark.parametrize("seed", [2**64, -(2**64), -(2**63) - 1, 10**30])
def test_out_of_range_seed_is_400_naming_seed(full: FullServer, seed: int) -> None:
    calls = full.engine.num_generate_calls
    with openai.OpenAI(base_url=full.url + "/v1", api_key=full.tenant_key, max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=seed, max_tokens=2)  # type: ignore[arg-type]
    assert info.value.status_code == 400 and info.value.param == "seed"
    assert full.engine.num_generate_calls == calls  # never reached the engine


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 0])
def test_seed_range_ends_are_served(full: FullServer, seed: int) -> None:
    with openai.OpenAI(base_url=full.url + "/v1", api_key=full.tenant_key, max_retries=0) as client:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=seed, max_tokens=2)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "length"


# -- defect 5: lone surrogates, deep nesting, dates and integers out of range ----------------------


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", b'{"model": "tiny-model", "messages": [{"role": "user", "content": "a\\ud800"}]}'),
        ("/v1/completions", b'{"model": "tiny-model", "prompt": "\\udfff b"}'),
        ("/v1/chat/completions", b'{"model": "\\ud800", "messages": [{"role": "user", "content": "a"}]}'),
        ("/v1/completions", b'{"model": "tiny-model", "prompt": "raw \xed\xa0\x80 bytes"}'),
    ],
)  # fmt: skip
def test_lone_surrogates_are_400(full: FullServer, path: str, body: bytes) -> None:
    error = assert_openai_error(post_raw(full, path, body), 400)
    assert error["code"] == "invalid_unicode"


def test_a_surrogate_pair_is_text(full: FullServer) -> None:
    body = b'{"model": "tiny-model", "prompt": "emoji \\ud83d\\ude00", "max_tokens": 2}'
    assert post_raw(full, "/v1/completions", body).status_code == 200


@pytest.mark.parametrize("depth", [33, 100_000])
def test_deep_nesting_is_400(full: FullServer, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    for path, headers in (("/v1/chat/completions", None), ("/admin/v1/tenants", ADMIN)):
        body = b'{"model": "tiny-model", "messages": ' + nested + b"}"
        error = assert_openai_error(post_raw(full, path, body, headers), 400)
        assert error["code"] == "json_too_deep"


def test_nan_and_infinity_are_400(full: FullServer) -> None:
    body = b'{"model": "tiny-model", "messages": [{"role": "user", "content": "a"}], "temperature": NaN}'
    assert_openai_error(post_raw(full, "/v1/chat/completions", body), 400)
    body = b'{"model": "tiny-model", "prompt": "a", "top_p": Infinity}'
    assert_openai_error(post_raw(full, "/v1/completions", body), 400)


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_expires_at_beyond_the_calendar_is_4xx(full: FullServer, when: str) -> None:
    r = httpx.post(f"{full.url}/admin/v1/tenants/{TENANT}/keys", json={"expires_at": when}, headers=ADMIN)
    assert_openai_error(r, 422, "expires_at")


@pytest.mark.parametrize("name", ["before", "limit"])
def test_audit_integers_beyond_int64_are_4xx(full: FullServer, name: str) -> None:
    r = httpx.get(f"{full.url}/admin/v1/audit", params={name: "9" * 30}, headers=ADMIN)
    assert_openai_error(r, 422, name)
    r = httpx.get(f"{full.url}/admin/v1/audit", params={name: "-1"}, headers=ADMIN)
    assert_openai_error(r, 422, name)


def test_prefix_registration_with_surrogate_text_is_400(full: FullServer) -> None:
    body = b'{"text": "system prompt \\ud800"}'
    error = assert_openai_error(post_raw(full, "/admin/v1/prefix-cache/prefixes", body, ADMIN), 400)
    assert error["code"] == "invalid_unicode"
    assert not any(call[0] == "register" for call in full.control.calls)


def test_prefix_registration_with_token_ids_outside_the_vocabulary_is_4xx(full: FullServer) -> None:
    r = httpx.post(
        f"{full.url}/admin/v1/prefix-cache/prefixes", json={"token_ids": [1, 2, 3, 10**30]}, headers=ADMIN
    )
    assert_openai_error(r, 422, "token_ids")


# -- input bounds: everything that costs engine time is bounded, and named when refused -----------


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
        ({"stop": [str(i) for i in range(MAX_STOP_STRINGS + 1)]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids"),
        ({"n": 17}, "n"),
        ({"use_beam_search": True, "beam_width": 17}, "beam_width"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2**40}, "top_k"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"temperature": 10**400}, "temperature"),
        ({"length_penalty": 1e9}, "length_penalty"),
        ({"user": "u" * 257}, "user"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ],
)
def test_chat_bounds_are_400_naming_the_field(full: FullServer, fields: dict[str, Any], param: str) -> None:
    calls = full.engine.num_generate_calls
    body = {"model": MODEL, "messages": MESSAGES, **fields}
    r = httpx.post(f"{full.url}/v1/chat/completions", json=body, headers=full.tenant, timeout=30)
    assert_openai_error(r, 400, param)
    assert full.engine.num_generate_calls == calls


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": ["a"] * (MAX_PROMPTS + 1)}, "prompt"),
        ({"prompt": [[1, 2]] * (MAX_PROMPTS + 1)}, "prompt"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),
        ({"prompt": "a", "best_of": 17}, "best_of"),
        ({"prompt": "a", "n": 2, "best_of": 3}, "best_of"),
        ({"prompt": ["a"] * 17, "n": 16}, "n"),  # 272 sequences > MAX_REQUEST_SEQUENCES
        ({"prompt": ["a"] * 17, "use_beam_search": True, "beam_width": 16, "max_tokens": 2}, "beam_width"),
    ],
)
def test_completion_bounds_are_400_naming_the_field(
    full: FullServer, fields: dict[str, Any], param: str
) -> None:
    r = httpx.post(f"{full.url}/v1/completions", json={"model": MODEL, **fields}, headers=full.tenant)
    assert_openai_error(r, 400, param)


def test_the_prompt_tokens_of_a_whole_request_are_bounded(
    full: FullServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_bodies, "MAX_REQUEST_PROMPT_TOKENS", 100)  # the context (256) is the floor
    calls = full.engine.num_generate_calls
    body = {"model": MODEL, "prompt": [[5] * 60] * 5, "max_tokens": 2}  # 300 tokens together
    r = httpx.post(f"{full.url}/v1/completions", json=body, headers=full.tenant, timeout=30)
    assert_openai_error(r, 400, "prompt")
    assert full.engine.num_generate_calls == calls
    body["prompt"] = [[5] * 60] * 4  # 240 tokens: fits
    assert (
        httpx.post(f"{full.url}/v1/completions", json=body, headers=full.tenant, timeout=30).status_code
        == 200
    )


def test_a_long_token_id_prompt_is_one_prompt_not_a_batch(full: FullServer) -> None:
    r = httpx.post(
        f"{full.url}/v1/completions",
        json={"model": MODEL, "prompt": [5] * (MAX_PROMPTS + 10), "max_tokens": 2},
        headers=full.tenant,
    )
    assert r.status_code == 200, r.text


def test_an_unknown_model_is_echoed_bounded(full: FullServer) -> None:
    name = "m" * 10_000
    r = httpx.post(
        f"{full.url}/v1/chat/completions", json={"model": name, "messages": MESSAGES}, headers=full.tenant
    )
    error = assert_openai_error(r, 404, "model")
    assert len(error["message"]) < 400


# -- slow and oversized clients ---------------------------------------------------------------------


def _slow_body_app() -> Starlette:
    async def echo(request: Request) -> Response:
        return JSONResponse({"size": len(await request.body())})

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, WeirError)
        return error_response(exc)

    return Starlette(
        routes=[Route("/echo", echo, methods=["POST"])],
        middleware=[Middleware(BodyLimitMiddleware, max_body_bytes=1 << 20, body_timeout_s=0.5)],
        exception_handlers={WeirError: on_error},
    )


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
                None,
            )  # fmt: skip
            if length is not None and len(rest) >= length:
                break
    return data


def test_a_body_that_trickles_is_408() -> None:
    with serve_in_thread(_slow_body_app()) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            # Headers promise 100 bytes; 10 arrive and then nothing (a slowloris client).
            sock.sendall(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n" + b"[" * 10
            )
            response = _read_response(sock)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_headers_beyond_the_limit_are_431(full: FullServer) -> None:
    big = {"x-big": "a" * (MAX_HEADER_BYTES + 1)}
    r = httpx.post(
        f"{full.url}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={**full.tenant, **big},
    )
    assert_openai_error(r, 431)
    assert httpx.get(f"{full.url}/health", headers={"x-ok": "a" * 1000}).status_code == 200


def test_headers_still_arriving_past_the_limit_close_the_connection() -> None:
    reached = []

    async def endpoint(request: Request) -> Response:
        reached.append(1)
        return JSONResponse({})

    app = Starlette(routes=[Route("/x", endpoint)])
    config = uvicorn_config(app, Settings(host="127.0.0.1", port=0))
    assert config.http is HeaderGuardProtocol and HeaderGuardProtocol.max_header_bytes == MAX_HEADER_BYTES
    with _serve_config(config) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n")
            # One header line that never ends, sent in pieces: cut off past the limit.
            with contextlib.suppress(OSError):
                for _ in range(4 * MAX_HEADER_BYTES // 1024):
                    sock.sendall(b"x-slow: " + b"a" * 1024)
            response = b""
            with contextlib.suppress(OSError):  # closed with a 400, or reset with data unread
                response = _read_response(sock)
        assert response == b"" or response.startswith(b"HTTP/1.1 400"), response[:100]
    assert reached == []


@contextlib.contextmanager
def _serve_config(config: uvicorn.Config) -> Iterator[str]:
    """`serve_in_thread`, but with the server's own uvicorn configuration."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
