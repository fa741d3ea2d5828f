"""gateway/routes/admin_http.py: the plumbing the /admin/v1 route modules share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from weir.gateway.http.errors import WeirError, to_http_error
from weir.gateway.routes.admin_http import bounded_query, json_answer, read_json_body
from weir.tenancy.errors import TenancyError


class _Answer(BaseModel):
    name: str


async def _echo(request: Request) -> Response:
    body: Any = await read_json_body(request, 64, empty={"blank": True})
    return json_answer({"body": body, "q": bounded_query(request, "q", max_len=4)}, 201)


async def _model(request: Request) -> Response:
    return json_answer(_Answer(name="x"), headers={"X-Extra": "1"})


async def _errors(request: Request, exc: Exception) -> Response:
    error = to_http_error(exc)
    assert isinstance(error, WeirError)
    return Response(str(error.status_code), status_code=error.status_code)


def _client() -> TestClient:
    app = Starlette(
        routes=[Route("/echo", _echo, methods=["POST"]), Route("/model", _model)],
        exception_handlers={WeirError: _errors, TenancyError: _errors},
    )
    return TestClient(app)


def test_a_body_is_decoded_within_its_bound_and_a_blank_one_is_the_given_empty() -> None:
    with _client() as client:
        r = client.post("/echo", content=b'{"a": 1}', params={"q": "abc"})
        assert r.status_code == 201 and r.json() == {"body": {"a": 1}, "q": "abc"}
        assert r.headers["cache-control"] == "no-store"
        assert client.post("/echo", content=b"  ").json()["body"] == {"blank": True}
        assert client.post("/echo", content=b"[" * 65).status_code == 413
        assert client.post("/echo", content=b"{").status_code == 400


def test_a_query_parameter_out_of_its_length_is_refused() -> None:
    with _client() as client:
        assert client.post("/echo", content=b"{}", params={"q": "abcde"}).status_code == 422
        assert client.post("/echo", content=b"{}", params={"q": ""}).status_code == 422


def test_a_model_answer_is_dumped_and_keeps_extra_headers() -> None:
    with _client() as client:
        r = client.get("/model")
        assert r.json() == {"name": "x"} and r.headers["x-extra"] == "1"
        assert r.headers["cache-control"] == "no-store"
