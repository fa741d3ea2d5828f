"""`Allow` on a 405 names every method of every route at the path, through mounts, and a
catch-all route only where nothing else matches."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from weir.gateway.http.allowed_methods import allow_header, allowed_methods
from weir.gateway.http.errors import exception_handlers


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


ROUTES = [
    Route("/items", ok, methods=["POST"]),
    Route("/items", ok, methods=["GET"]),
    Mount(
        "/admin",
        routes=[
            Route("/things/{name}", ok, methods=["PATCH"]),
            Route("/things/{name}", ok, methods=["GET"]),
            Route("/{path:path}", ok, methods=["GET", "DELETE"]),
        ],
    ),
]


def _scope(path: str, method: str = "TRACE") -> dict[str, object]:
    return {"type": "http", "path": path, "method": method, "root_path": ""}


def test_every_route_at_the_path_counts() -> None:
    assert allowed_methods(ROUTES, _scope("/items")) == ["GET", "HEAD", "POST"]
    assert allowed_methods(ROUTES, _scope("/admin/things/x")) == ["GET", "HEAD", "PATCH"]
    assert allowed_methods(ROUTES, _scope("/admin/other")) == ["DELETE", "GET", "HEAD"]  # the catch-all
    assert allowed_methods(ROUTES, _scope("/admin/other"), catch_all=False) == []
    assert allow_header(ROUTES, _scope("/nothing")) == {}


def test_a_scope_a_mount_rewrote_matches_from_the_root() -> None:
    inner = {**_scope("/admin/things/x"), "root_path": "/admin", "app_root_path": ""}
    assert allowed_methods(ROUTES, inner) == ["GET", "HEAD", "PATCH"]


def test_the_app_answers_405_with_the_whole_list() -> None:
    app = Starlette(routes=ROUTES, exception_handlers=exception_handlers())
    with TestClient(app) as client:
        r = client.request("TRACE", "/items")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        inner = client.request("PUT", "/admin/things/x")
        assert inner.status_code == 405 and inner.headers["allow"] == "GET, HEAD, PATCH"
