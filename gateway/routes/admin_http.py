"""The HTTP plumbing every /admin/v1 route module shares: the admin-token check, reading a bounded
JSON body, a bounded query parameter, a path parameter that must name something, answers that are
never cached, and `AdminRoutes`, the skeleton of a resource's endpoints.

Errors are raised, never answered here: the app's one mapper (`weir.gateway.http.errors`) answers them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import NotFoundError, PayloadTooLargeError
from weir.gateway.http.json_body import loads_bounded
from weir.tenancy.admin_bodies.fields import MAX_QUERY_LEN
from weir.tenancy.errors import FieldError

NO_STORE = {"Cache-Control": "no-store"}  # answers may carry a key, shown only once

AdminHandler = Callable[[Request, str], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def client_addr(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def admin_endpoint(admin_auth: AdminAuthenticator, handler: AdminHandler) -> Endpoint:
    """`handler` behind the admin token; it gets the actor the audit log records."""

    async def endpoint(request: Request) -> Response:
        addr = client_addr(request)
        await admin_auth.authenticate_async(request.headers.get("authorization"), addr)
        return await handler(request, f"admin-api {addr}")

    return endpoint


def json_answer(
    body: BaseModel | Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """A JSON answer (a pydantic model is dumped in JSON mode), never cached."""
    content = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return JSONResponse(content, status_code=status_code, headers={**NO_STORE, **(headers or {})})


async def read_json_body(request: Request, max_bytes: int, empty: Any = None) -> Any:
    """The decoded JSON body within `max_bytes` (413 past it); `empty` for a blank body. Invalid
    JSON, too deep nesting and lone surrogates are 400s (`loads_bounded`)."""
    raw = await request.body()
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    return loads_bounded(raw) if raw.strip() else empty


def bounded_query(request: Request, name: str, max_len: int = MAX_QUERY_LEN) -> str | None:
    """An optional query parameter of 1 to `max_len` characters (a 422 naming it otherwise)."""
    value = request.query_params.get(name)
    if value is not None and not 1 <= len(value) <= max_len:
        raise FieldError(name, f"must be 1-{max_len} characters")
    return value


def named_in_path(
    request: Request, key: str, check: Callable[[str], str], missing: Callable[[str], NotFoundError]
) -> str:
    """Path parameter `key` as `check` accepts it; a value it refuses (`FieldError`) names nothing
    that can exist, so it is `missing(value)`, a 404."""
    value = request.path_params[key]
    try:
        return check(value)
    except FieldError:
        raise missing(value) from None


class AdminRoutes:
    """A resource's endpoints under /admin/v1: each handler behind the admin token (it gets the
    actor), JSON bodies of at most `max_body_bytes` (an empty one is `{}` where
    `blank_is_empty_object`, else None). A subclass lists its `(method, path, handler)`s in
    `endpoints()`; `routes()` makes the routes."""

    max_body_bytes: ClassVar[int] = 1 << 20
    blank_is_empty_object: ClassVar[bool] = False

    def __init__(self, admin_auth: AdminAuthenticator) -> None:
        self.admin_auth = admin_auth

    def admin(self, handler: AdminHandler) -> Endpoint:
        return admin_endpoint(self.admin_auth, handler)

    async def body(self, request: Request) -> Any:
        return await read_json_body(request, self.max_body_bytes, {} if self.blank_is_empty_object else None)

    def endpoints(self) -> list[tuple[str, str, AdminHandler]]:
        raise NotImplementedError

    @staticmethod
    def actions(path: str, handlers: dict[str, AdminHandler]) -> list[tuple[str, str, AdminHandler]]:
        """`POST {path}/{action}` for each action: what one adapter or version can be told to do."""
        return [("POST", f"{path}/{action}", handler) for action, handler in handlers.items()]

    def routes(self) -> list[BaseRoute]:
        return [
            Route(path, self.admin(handler), methods=[method]) for method, path, handler in self.endpoints()
        ]
