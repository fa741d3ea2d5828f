"""The console's plumbing: its dependencies, templates, security headers, and the session and
CSRF checks every page, data endpoint and action goes through (`ConsoleBase`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from weir.engine.engine_stats import EngineStats
from weir.gateway.console.forms import read_form
from weir.gateway.console.live_tenants import LiveTenants
from weir.gateway.console.sessions import ConsoleSession, SessionStore
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.errors import WeirError
from weir.gateway.metrics.registry import GatewayMetrics
from weir.tenancy.errors import TenancyError
from weir.tenancy.repository.repo import TenancyRepo

logger = logging.getLogger(__name__)

PREFIX = "/admin/ui"
SESSION_COOKIE = "weir_console"
LOGIN_COOKIE = "weir_console_login"  # the login form's CSRF token (double submit), before a session
HERE = Path(__file__).parent
STATIC_ASSETS = {"console.css": "text/css", "console.js": "text/javascript"}
# Pages may show a key once; nothing here may be cached, framed, or run a script it did not ship.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
CONSOLE_ERRORS = (WeirError, TenancyError, SQLAlchemyError)

Handler = Callable[[Request, ConsoleSession], Awaitable[Response]]


@dataclass
class ConsoleDeps:
    """What the console reads and changes: the same objects the admin API uses."""

    repo: TenancyRepo
    authenticator: Authenticator  # its cache is invalidated on tenant and key changes
    admin_auth: AdminAuthenticator  # checks the login token, with its failure throttle
    stats_by_version: Callable[[], Mapping[str, EngineStats]]  # the metrics' EngineStats
    rollout: ModelRollout | None = None
    sessions: SessionStore = field(default_factory=SessionStore)
    metrics: GatewayMetrics | None = None  # per-tenant throughput and latency on the live page


def _templates() -> jinja2.Environment:
    # Autoescape everything: tenant names, model paths, `user` values and error messages that
    # echo input are rendered as text, never as markup.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["prefix"] = PREFIX
    return env


def client_addr(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def is_https(request: Request) -> bool:
    # uvicorn rewrites the scheme from X-Forwarded-Proto only for trusted proxies (--forwarded-allow-ips).
    return request.url.scheme == "https"


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def engine_rows(stats: Mapping[str, EngineStats]) -> list[dict[str, Any]]:
    """One row per loaded version: what the live page shows and its JSON endpoint returns."""
    rows = []
    for version_id, s in sorted(stats.items()):
        host = s.host_kv
        rows.append(
            {
                "version": version_id,
                "waiting": s.num_waiting,
                "running": s.num_running,
                "waiting_tokens": s.num_waiting_tokens,
                "kv_usage": _percent(s.kv_usage),
                "host_kv_usage": "off" if host is None else _percent(host.usage),
                "swapped": 0 if host is None else host.num_swapped_requests,
                "prefill_tokens_per_s": f"{s.prefill_tokens_per_s:.1f}",
                "decode_steps_per_s": f"{s.decode_steps_per_s:.2f}",
                "prefix_hit_rate": _percent(s.prefix_cache_hit_rate),
                "preemptions": s.num_preemptions,
                "prompt_tokens": s.num_prompt_tokens_total,
                "generation_tokens": s.num_generation_tokens_total,
            }
        )
    return rows


class ConsoleBase:
    """The console's plumbing over `ConsoleDeps`; the page groups subclass it."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps
        self.repo = deps.repo
        self.sessions = deps.sessions
        self.env = _templates()
        self.live_tenants = LiveTenants(deps.metrics) if deps.metrics is not None else None

    # -- plumbing ---------------------------------------------------------------------------------

    def render(
        self, name: str, status_code: int = 200, session: ConsoleSession | None = None, **context: Any
    ) -> HTMLResponse:
        context.setdefault("error", None)
        context.setdefault("notice", None)
        context.setdefault("nav", "")
        html = self.env.get_template(name).render(
            csrf=session.csrf_token if session is not None else "", logged_in=session is not None, **context
        )
        return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)

    def _session(self, request: Request) -> ConsoleSession | None:
        return self.sessions.get(request.cookies.get(SESSION_COOKIE))

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET page: without a session, to the login form (a tenant key in a header counts for nothing)."""

        async def endpoint(request: Request) -> Response:
            session = self._session(request)
            if session is None:
                return RedirectResponse(f"{PREFIX}/login", 303, headers=SECURITY_HEADERS)
            return await handler(request, session)

        return endpoint

    def data(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET of data for a page's script: 401 without a session."""

        async def endpoint(request: Request) -> Response:
            session = self._session(request)
            if session is None:
                return JSONResponse({"error": "log in"}, 401, headers=SECURITY_HEADERS)
            return await handler(request, session)

        return endpoint

    def action(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A POST: 403 without a session or without its CSRF token (read from the form)."""

        async def endpoint(request: Request) -> Response:
            session = self._session(request)
            form = await read_form(request)
            if session is None or not session.csrf_ok(form.get("csrf_token")):
                return self.render("forbidden.html", 403, session)
            request.state.form = form
            return await handler(request, session)

        return endpoint

    @staticmethod
    def _actor(request: Request) -> str:
        return f"admin-console {client_addr(request)}"
