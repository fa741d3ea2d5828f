"""A scripted OpenAI-compatible streaming server for the bench tests (run as a subprocess).

Behaviour is chosen by a path prefix, so one server process serves every test:
`/s/{mode}/{ttft_ms}/{itl_ms}/v1/chat/completions` (plain `/v1/...` is `ok/100/20`).

- ok: a role-only chunk at once, then `max_tokens` content chunks, the first `ttft_ms` after
  the request arrived and each next one `itl_ms` later (on an absolute schedule, so delays do
  not add up), then a finish_reason chunk, a usage chunk and `[DONE]`.
- 500 / 429: an OpenAI-shaped error with that status (429 carries Retry-After).
- reset: three content chunks, then the connection is cut mid-stream.
- garbage: a chunk that is not JSON.
- nodone: content chunks, then the stream ends without finish_reason or `[DONE]`.
- hang: nothing after the headers (for client timeouts).
- flaky: by the number at the end of `x-request-id`, cycles ok, 500, 429, reset, garbage.

Every streamed request is logged (`GET /_log`): request id, path, body, authorization header,
tokens sent, and whether it completed or the client disconnected. An admin API for tenants and
keys (`POST /admin/v1/tenants`, `POST /admin/v1/tenants/{name}/keys`, bearer `admin-secret`)
and `GET /v1/models` are there too. Run: `python fake_openai_server.py` prints `PORT <n>`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

ADMIN_TOKEN = "admin-secret"
MODEL = {
    "id": "fake-model",
    "object": "model",
    "owned_by": "tests",
    "batch_policy": "continuous",
    "dtype": "float32",
}
FLAKY_CYCLE = ("ok", "500", "429", "reset", "garbage")

LOG: list[dict[str, Any]] = []
TENANTS: dict[str, dict[str, Any]] = {}


def _chunk(kind: str, *, content: str | None = None, finish: str | None = None, usage: Any = None) -> bytes:
    if usage is not None:
        obj: dict[str, Any] = {"id": "x", "object": "chunk", "choices": [], "usage": usage}
    elif kind == "chat":
        delta = {"content": content} if content is not None else {"role": "assistant", "content": ""}
        obj = {
            "id": "x",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    else:
        obj = {
            "id": "x",
            "object": "text_completion",
            "choices": [{"index": 0, "text": content or "", "finish_reason": finish}],
        }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _prompt_words(body: dict[str, Any]) -> int:
    if "prompt" in body:
        return len(str(body["prompt"]).split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


class StreamEndpoint:
    """Raw ASGI endpoint: exact control of when chunks go out and of disconnect detection."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.perf_counter()
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        params = scope.get("path_params", {})
        mode = params.get("mode", "ok")
        ttft_s, itl_s = int(params.get("ttft_ms", 100)) / 1000, int(params.get("itl_ms", 20)) / 1000
        rid = headers.get("x-request-id", "")
        if mode == "flaky":
            mode = FLAKY_CYCLE[int(rid.rsplit("-", 1)[-1]) % len(FLAKY_CYCLE)]
        entry = {"request_id": rid, "path": scope["path"], "body": body, "mode": mode,
                 "authorization": headers.get("authorization"), "tokens_sent": 0, "outcome": "running",
                 "arrived": arrived, "sent_at": []}  # fmt: skip
        LOG.append(entry)
        if mode in ("500", "429"):
            status = int(mode)
            extra = [(b"retry-after", b"1")] if status == 429 else []
            err = json.dumps(
                {"error": {"message": f"scripted {status}", "type": "x", "param": None, "code": None}}
            )
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"), *extra]})  # fmt: skip
            await send({"type": "http.response.body", "body": err.encode()})
            entry["outcome"] = "error"
            return
        disconnected = asyncio.Event()
        sent_at: list[float] = entry["sent_at"]

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())

        async def emit(data: bytes, due: float | None = None) -> bool:
            if due is not None:
                try:
                    await asyncio.wait_for(disconnected.wait(), max(0.0, due - time.perf_counter()))
                except TimeoutError:
                    pass
            if disconnected.is_set():
                return False
            await send({"type": "http.response.body", "body": data, "more_body": True})
            sent_at.append(time.perf_counter())
            return True

        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})  # fmt: skip
            if mode == "hang":
                await disconnected.wait()
                entry["outcome"] = "disconnected"
                return
            if self.kind == "chat" and not await emit(_chunk("chat")):
                entry["outcome"] = "disconnected"
                return
            n = int(body.get("max_tokens", 16))
            for i in range(n):
                if mode == "reset" and i == 3:
                    entry["outcome"] = "reset"
                    raise RuntimeError("scripted connection reset")
                if mode == "garbage" and i == 1:
                    await emit(b"data: {this is not json\n\n")
                if not await emit(_chunk(self.kind, content=f"t{i} "), arrived + ttft_s + i * itl_s):
                    entry["outcome"] = "disconnected"
                    return
                entry["tokens_sent"] = i + 1
            if mode == "nodone":
                entry["outcome"] = "completed"
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            usage = {
                "prompt_tokens": _prompt_words(body),
                "completion_tokens": n,
                "total_tokens": _prompt_words(body) + n,
            }
            for data in (
                _chunk(self.kind, finish="length"),
                _chunk(self.kind, usage=usage),
                b"data: [DONE]\n\n",
            ):
                if not await emit(data):
                    entry["outcome"] = "disconnected"
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            entry["outcome"] = "completed"
        except OSError:
            entry["outcome"] = "disconnected"
        finally:
            watcher.cancel()


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [MODEL]})


async def get_log(request: Request) -> JSONResponse:
    return JSONResponse(LOG)


async def clear_log(request: Request) -> JSONResponse:
    LOG.clear()
    return JSONResponse({})


def _admin_ok(request: Request) -> bool:
    return request.headers.get("authorization") == f"Bearer {ADMIN_TOKEN}"


async def create_tenant(request: Request) -> JSONResponse:
    if not _admin_ok(request):
        return JSONResponse({"error": {"message": "bad admin token"}}, status_code=401)
    body = await request.json()
    if body["name"] in TENANTS:
        return JSONResponse({"error": {"message": "exists"}}, status_code=409)
    TENANTS[body["name"]] = {**body, "keys": []}
    return JSONResponse({"name": body["name"]}, status_code=201)


async def create_key(request: Request) -> JSONResponse:
    if not _admin_ok(request):
        return JSONResponse({"error": {"message": "bad admin token"}}, status_code=401)
    name = request.path_params["name"]
    if name not in TENANTS:
        return JSONResponse({"error": {"message": "no such tenant"}}, status_code=404)
    key_id = f"k{len(TENANTS[name]['keys'])}"
    TENANTS[name]["keys"].append(key_id)
    return JSONResponse({"id": key_id, "key": f"sk-{name}-{key_id}"}, status_code=201)


def _api_routes() -> list[Any]:
    return [
        Route("/v1/chat/completions", StreamEndpoint("chat"), methods=["POST"]),
        Route("/v1/completions", StreamEndpoint("completion"), methods=["POST"]),
        Route("/v1/models", models),
        Route("/admin/v1/tenants", create_tenant, methods=["POST"]),
        Route("/admin/v1/tenants/{name}/keys", create_key, methods=["POST"]),
    ]


def build_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/_log", get_log, methods=["GET"]),
            Route("/_log", clear_log, methods=["DELETE"]),
            Mount("/s/{mode}/{ttft_ms:int}/{itl_ms:int}", routes=_api_routes()),
            *_api_routes(),
        ]
    )


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(build_app(), log_level="critical", access_log=False, http="h11", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
