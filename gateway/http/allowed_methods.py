"""The `Allow` header of a 405: every method the app serves at the request's path.

Starlette answers a method no route takes with the methods of the first route that matched the
path alone; routes here are declared one per method (`GET /admin/v1/tenants` and `POST` are two
routes), so that header would name one of them, and the app's error mapper dropped it anyway.
RFC 9110 (15.5.6) requires `Allow` on a 405 and clients (and schema checkers) read it as the whole
list, so it is computed over every route of the app, mounts included. A catch-all route
(`/{path:path}`, which answers unknown admin paths with 404) counts only where no other route
matches the path.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import Scope

CATCH_ALL = "/{path:path}"


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope, *, catch_all: bool = True) -> list[str]:
    """The methods some route of the app's `routes` serves at `scope`'s path, sorted (empty: no
    route). `scope` may be one a mount rewrote: the match starts again from the app's root.
    `catch_all` False: a catch-all route's methods never count."""
    root = scope.get("app_root_path", scope.get("root_path", ""))
    found: set[str] = set()
    fallback: set[str] = set()
    _collect(routes, {**scope, "root_path": root}, found, fallback)
    return sorted(found or (fallback if catch_all else set()))


def _collect(routes: Sequence[BaseRoute], scope: Scope, found: set[str], fallback: set[str]) -> None:
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.NONE:
            continue
        if isinstance(route, Mount):
            _collect(route.routes, {**scope, **child}, found, fallback)
        elif isinstance(route, Route) and route.methods:
            (fallback if route.path == CATCH_ALL else found).update(route.methods)


def allow_header(routes: Sequence[BaseRoute], scope: Scope) -> dict[str, str]:
    """`{"Allow": "GET, HEAD"}` for a 405 at `scope`'s path; empty when no route matches it."""
    methods = allowed_methods(routes, scope)
    return {"Allow": ", ".join(methods)} if methods else {}
