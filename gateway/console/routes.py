"""The console's pages and actions under /admin/ui.

Every page needs a console session (a cookie set at login with the admin token); without one a
page redirects to the login form, a JSON endpoint answers 401 and an action 403. Every POST
carries the session's CSRF token (403 without it). Actions call the repository and the rollout
in-process, as the admin API does, and are audited by them with the actor `admin-console <addr>`.
Errors are shown on the page they came from, with the status the admin API would answer.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from engine.output import EngineStats
from engine.request import Priority
from gateway.auth import AdminAuthenticator, Authenticator
from gateway.console.forms import optional_int, read_form
from gateway.console.sessions import ConsoleSession, SessionStore
from gateway.errors import NotFoundError, WeirError, to_http_error
from gateway.model_rollout import ModelRollout
from tenancy.admin_bodies.fields import parse_date
from tenancy.admin_bodies.keys import ApiKey, KeyCreate
from tenancy.admin_bodies.parsing import parse_model
from tenancy.admin_bodies.quota import parse_quota_limits
from tenancy.admin_bodies.tenants import TenantCreate, TenantPatch
from tenancy.enums import KeyScope
from tenancy.errors import FieldError, TenancyError
from tenancy.keys import is_public_id
from tenancy.model_version_records import TrafficPlan
from tenancy.quota_limits import INT_QUOTA_FIELDS
from tenancy.records import DailyUsage, validate_tenant_name
from tenancy.repo import TenancyRepo

logger = logging.getLogger(__name__)

PREFIX = "/admin/ui"
SESSION_COOKIE = "weir_console"
LOGIN_COOKIE = "weir_console_login"  # the login form's CSRF token (double submit), before a session
_HERE = Path(__file__).parent
_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
_USAGE_DAYS = 30
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
_CONSOLE_ERRORS = (WeirError, TenancyError, SQLAlchemyError)

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


def _templates() -> jinja2.Environment:
    # Autoescape everything: tenant names, model paths, `user` values and error messages that
    # echo input are rendered as text, never as markup.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["prefix"] = PREFIX
    return env


def _addr(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _is_https(request: Request) -> bool:
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
            }
        )
    return rows


def usage_chart(days: list[DailyUsage], width: int = 600, height: int = 160) -> list[dict[str, Any]]:
    """Bars (x, y, width, height, label) for tokens per day, scaled to the tallest day."""
    if not days:
        return []
    totals = [d.prompt_tokens + d.completion_tokens for d in days]
    top = max(totals) or 1
    slot = width / len(days)
    bars: list[dict[str, Any]] = []
    for d, total in zip(days, totals, strict=True):
        h = round(height * total / top, 1)
        bars.append(
            {
                "x": round(slot * len(bars) + slot * 0.1, 1),
                "y": round(height - h, 1),
                "width": round(slot * 0.8, 1),
                "height": h,
                "label": f"{d.day.isoformat()}: {total} tokens",
            }
        )
    return bars


class ConsoleRoutes:
    """The console's endpoints over `ConsoleDeps`."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps
        self.repo = deps.repo
        self.sessions = deps.sessions
        self.env = _templates()

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
        return f"admin-console {_addr(request)}"

    # -- login ------------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self._session(request) is not None:
            return RedirectResponse(f"{PREFIX}/tenants", 303, headers=SECURITY_HEADERS)
        return self._login_page(request, None, 200)

    def _login_page(self, request: Request, error: str | None, status_code: int) -> Response:
        token = secrets.token_urlsafe(32)
        response = self.render("login.html", status_code, None, login_csrf=token, error=error)
        response.set_cookie(
            LOGIN_COOKIE,
            token,
            max_age=600,
            path=PREFIX,
            secure=_is_https(request),
            httponly=True,
            samesite="strict",
        )
        return response

    async def login(self, request: Request) -> Response:
        form = await read_form(request)
        expected = request.cookies.get(LOGIN_COOKIE)
        sent = form.get("csrf_token")
        if not expected or sent is None or not ConsoleSession(csrf_token=expected).csrf_ok(sent):
            return self.render("forbidden.html", 403, None)
        token = form.get("token", "").strip()
        try:
            # The admin API's check and failure throttle: a wrong token counts, 429 past the limit.
            await self.deps.admin_auth.authenticate_async(f"Bearer {token}", _addr(request))
        except WeirError as exc:
            response = self._login_page(request, exc.message, exc.status_code)
            response.headers.update(exc.headers)
            return response
        session = self.sessions.create()
        logger.info("admin console login from %s", _addr(request))
        response = RedirectResponse(f"{PREFIX}/tenants", 303, headers=SECURITY_HEADERS)
        response.set_cookie(
            SESSION_COOKIE,
            session.session_id,
            max_age=int(self.sessions.ttl_s),
            path=PREFIX,
            secure=_is_https(request),
            httponly=True,
            samesite="strict",
        )
        response.delete_cookie(LOGIN_COOKIE, path=PREFIX)
        return response

    async def logout(self, request: Request, session: ConsoleSession) -> Response:
        self.sessions.end(session.session_id)
        response = RedirectResponse(f"{PREFIX}/login", 303, headers=SECURITY_HEADERS)
        response.delete_cookie(
            SESSION_COOKIE, path=PREFIX, secure=_is_https(request), httponly=True, samesite="strict"
        )
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            raise NotFoundError("no such console asset")
        return FileResponse(
            _HERE / "static" / name,
            media_type=_STATIC[name],
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )

    async def home(self, request: Request, session: ConsoleSession) -> Response:
        return RedirectResponse(f"{PREFIX}/tenants", 303, headers=SECURITY_HEADERS)

    # -- tenants ----------------------------------------------------------------------------------

    async def tenants(
        self, request: Request, session: ConsoleSession, error: str | None = None, status_code: int = 200
    ) -> Response:
        query = request.query_params.get("q", "")[:128]
        tenants = await run_in_threadpool(self.repo.list_tenants)
        shown = [t for t in tenants if query.lower() in t.name]
        return self.render(
            "tenants.html",
            status_code,
            session,
            nav="tenants",
            tenants=shown,
            num_tenants=len(tenants),
            query=query,
            priorities=[p.name.lower() for p in Priority],
            error=error,
            form=getattr(request.state, "form", {}),
        )

    async def create_tenant(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form
        try:
            body: dict[str, Any] = {
                "name": form.get("name", "").strip(),
                "priority": form.get("priority") or None,
            }
            if form.get("weight", "").strip():
                body["weight"] = _float(form["weight"], "weight")
            spec = parse_model(TenantCreate, body).spec()
            tenant = await run_in_threadpool(
                lambda: self.repo.create_tenant(spec, actor=self._actor(request))
            )
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.tenants(request, session, error.message, error.status_code)
        return RedirectResponse(f"{PREFIX}/tenants/{tenant.name}", 303, headers=SECURITY_HEADERS)

    def _tenant_name(self, request: Request) -> str:
        name = request.path_params["name"]
        try:
            return validate_tenant_name(name)
        except FieldError:
            raise NotFoundError(f"tenant {name!r} not found") from None

    async def tenant(
        self,
        request: Request,
        session: ConsoleSession,
        error: str | None = None,
        status_code: int = 200,
        new_key: str | None = None,
        notice: str | None = None,
    ) -> Response:
        name = self._tenant_name(request)
        try:
            tenant = await run_in_threadpool(self.repo.get_tenant, name)
            keys = await run_in_threadpool(self.repo.list_keys, name)
        except _CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="tenants")
        now = self.repo.now()
        return self.render(
            "tenant.html",
            status_code,
            session,
            nav="tenants",
            tenant=tenant,
            priority=tenant.priority.name.lower(),
            priorities=[p.name.lower() for p in Priority],
            quota=tenant.quota.as_dict(),
            quota_fields=INT_QUOTA_FIELDS,
            keys=[ApiKey.of(k, now).model_dump(mode="json") for k in keys],
            scopes=[s.value for s in KeyScope],
            new_key=new_key,
            error=error,
            notice=notice,
        )

    async def _tenant_action(
        self, request: Request, session: ConsoleSession, change: Callable[[str, str], Any], notice: str
    ) -> Response:
        name = self._tenant_name(request)
        try:
            await run_in_threadpool(change, name, self._actor(request))
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.tenant(request, session, error.message, error.status_code)
        self.deps.authenticator.invalidate_tenant(name)
        return await self.tenant(request, session, notice=notice)

    async def update_tenant(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form

        def change(name: str, actor: str) -> Any:
            body: dict[str, Any] = {"priority": form.get("priority") or None}
            if form.get("weight", "").strip():
                body["weight"] = _float(form["weight"], "weight")
            return self.repo.update_tenant(name, parse_model(TenantPatch, body).update(), actor=actor)

        return await self._tenant_action(request, session, change, "Settings saved.")

    async def set_quota(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form

        def change(name: str, actor: str) -> Any:
            body: dict[str, Any] = {f: optional_int(form, f) for f in INT_QUOTA_FIELDS}
            body["models"] = [m.strip() for m in form.get("models", "").split(",") if m.strip()]
            return self.repo.set_quota(name, parse_quota_limits(body, where="body"), actor=actor)

        return await self._tenant_action(request, session, change, "Quota saved.")

    async def suspend_tenant(self, request: Request, session: ConsoleSession) -> Response:
        if request.state.form.get("confirm") != "yes":
            return await self.tenant(request, session, "Tick the box to confirm the suspension.", 422)

        def change(name: str, actor: str) -> Any:
            return self.repo.suspend_tenant(name, actor=actor)

        return await self._tenant_action(request, session, change, "Tenant suspended.")

    # -- keys -------------------------------------------------------------------------------------

    async def issue_key(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form
        name = self._tenant_name(request)
        try:
            scopes = [s.value for s in KeyScope if form.get(f"scope_{s.value}") == "on"]
            body: dict[str, Any] = {"scopes": scopes or None}
            if form.get("expires_at", "").strip():
                body["expires_at"] = form["expires_at"].strip()
            spec = parse_model(KeyCreate, body).spec()
            issued = await run_in_threadpool(
                lambda: self.repo.issue_key(name, spec, actor=self._actor(request))
            )
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.tenant(request, session, error.message, error.status_code)
        # The secret is in this one response body (no-store), never in a URL, a cookie or a log.
        return await self.tenant(request, session, new_key=issued.key, notice="Key issued.", status_code=201)

    async def revoke_key(self, request: Request, session: ConsoleSession) -> Response:
        key_id = request.path_params["key_id"]
        if not is_public_id(key_id):
            raise NotFoundError(f"API key {key_id!r} not found")
        try:
            key = await run_in_threadpool(lambda: self.repo.revoke_key(key_id, actor=self._actor(request)))
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return self.render("error.html", error.status_code, session, error=error.message, nav="tenants")
        self.deps.authenticator.invalidate(key_id)
        return RedirectResponse(f"{PREFIX}/tenants/{key.tenant}", 303, headers=SECURITY_HEADERS)

    # -- live engine ------------------------------------------------------------------------------

    async def engine(self, request: Request, session: ConsoleSession) -> Response:
        rows = engine_rows(self.deps.stats_by_version())
        return self.render("engine.html", 200, session, nav="engine", rows=rows)

    async def engine_json(self, request: Request, session: ConsoleSession) -> Response:
        return JSONResponse({"data": engine_rows(self.deps.stats_by_version())}, headers=SECURITY_HEADERS)

    # -- audit ------------------------------------------------------------------------------------

    async def audit(self, request: Request, session: ConsoleSession) -> Response:
        tenant = request.query_params.get("tenant", "").strip() or None
        error = None
        events: list[Any] = []
        try:
            before = optional_int(dict(request.query_params), "before")
            events = await run_in_threadpool(
                lambda: self.repo.list_audit(tenant=tenant, limit=50, before_id=before)
            )
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc).message
        return self.render(
            "audit.html",
            422 if error else 200,
            session,
            nav="audit",
            events=events,
            tenant=tenant or "",
            older=events[-1].id if len(events) == 50 else None,
            error=error,
        )

    # -- usage ------------------------------------------------------------------------------------

    async def _usage(
        self, request: Request
    ) -> tuple[str | None, dt.date, dt.date, list[DailyUsage], list[str]]:
        tenants = [t.name for t in await run_in_threadpool(self.repo.list_tenants)]
        tenant = request.query_params.get("tenant") or (tenants[0] if tenants else None)
        today = self.repo.now().date()
        since_raw, until_raw = request.query_params.get("since"), request.query_params.get("until")
        since = parse_date(since_raw, "since") if since_raw else today - dt.timedelta(days=_USAGE_DAYS - 1)
        until = parse_date(until_raw, "until") if until_raw else today
        days: list[DailyUsage] = []
        if tenant is not None:
            days = await run_in_threadpool(lambda: self.repo.usage_by_day(tenant, since=since, until=until))
        return tenant, since, until, days, tenants

    async def usage(self, request: Request, session: ConsoleSession) -> Response:
        try:
            tenant, since, until, days, tenants = await self._usage(request)
        except _CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        return self.render(
            "usage.html",
            200,
            session,
            nav="usage",
            tenant=tenant or "",
            tenants=tenants,
            since=since.isoformat(),
            until=until.isoformat(),
            days=days,
            bars=usage_chart(days),
        )

    async def usage_csv(self, request: Request, session: ConsoleSession) -> Response:
        try:
            tenant, since, until, days, _ = await self._usage(request)
        except _CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            [
                "tenant",
                "day",
                "requests",
                "completed",
                "failed",
                "cancelled",
                "prompt_tokens",
                "completion_tokens",
                "cached_tokens",
            ]  # fmt: skip
        )
        for d in days:
            writer.writerow(
                [
                    tenant,
                    d.day.isoformat(),
                    d.num_requests,
                    d.num_completed,
                    d.num_failed,
                    d.num_cancelled,
                    d.prompt_tokens,
                    d.completion_tokens,
                    d.cached_tokens,
                ]  # fmt: skip
            )
        filename = f"weir-usage-{tenant}-{since.isoformat()}-{until.isoformat()}.csv"
        return Response(
            out.getvalue(),
            media_type="text/csv",
            headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{filename}"'},
        )

    # -- model versions ---------------------------------------------------------------------------

    async def models(
        self, request: Request, session: ConsoleSession, error: str | None = None, status_code: int = 200,
        notice: str | None = None,
    ) -> Response:  # fmt: skip
        if self.deps.rollout is None:
            return self.render("models.html", status_code, session, nav="models", groups=[], error=error,
                               notice="Model versions are managed by `weir serve`.")  # fmt: skip
        statuses, plans = await self.deps.rollout.list()
        groups: dict[str, list[Any]] = {}
        for status in statuses:
            groups.setdefault(status.record.name, []).append(status)
        return self.render(
            "models.html",
            status_code,
            session,
            nav="models",
            groups=sorted(groups.items()),
            plans=plans,
            error=error,
            notice=notice,
        )

    async def set_traffic(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form
        name = request.path_params["name"]
        if self.deps.rollout is None:
            raise NotFoundError("model versions are not managed here")
        if form.get("confirm") != "yes":
            return await self.models(request, session, "Tick the box to confirm the traffic change.", 422)
        try:
            split = {}
            for key, value in form.items():
                if key.startswith("split.") and value.strip():
                    percent = optional_int(form, key)
                    if percent:
                        split[key.removeprefix("split.")] = percent
            current = await self.deps.rollout.traffic(name)
            plan = TrafficPlan(name, split, dict(current.pins))
            await self.deps.rollout.set_traffic(plan, self._actor(request))
        except _CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.models(request, session, error.message, error.status_code)
        return await self.models(request, session, notice=f"Traffic for {name} saved.")

    # -- table ------------------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        page, data, action = self.page, self.data, self.action
        return [
            Mount(
                PREFIX,
                routes=[
                    Route("/", page(self.home), methods=["GET"]),
                    Route("/static/{name}", self.static, methods=["GET"]),
                    Route("/login", self.login_form, methods=["GET"]),
                    Route("/login", self.login, methods=["POST"]),
                    Route("/logout", action(self.logout), methods=["POST"]),
                    Route("/tenants", page(self.tenants), methods=["GET"]),
                    Route("/tenants", action(self.create_tenant), methods=["POST"]),
                    Route("/tenants/{name}", page(self.tenant), methods=["GET"]),
                    Route("/tenants/{name}", action(self.update_tenant), methods=["POST"]),
                    Route("/tenants/{name}/quota", action(self.set_quota), methods=["POST"]),
                    Route("/tenants/{name}/suspend", action(self.suspend_tenant), methods=["POST"]),
                    Route("/tenants/{name}/keys", action(self.issue_key), methods=["POST"]),
                    Route("/keys/{key_id}/revoke", action(self.revoke_key), methods=["POST"]),
                    Route("/engine", page(self.engine), methods=["GET"]),
                    Route("/engine.json", data(self.engine_json), methods=["GET"]),
                    Route("/audit", page(self.audit), methods=["GET"]),
                    Route("/usage", page(self.usage), methods=["GET"]),
                    Route("/usage.csv", page(self.usage_csv), methods=["GET"]),
                    Route("/models", page(self.models), methods=["GET"]),
                    Route("/models/{name}/traffic", action(self.set_traffic), methods=["POST"]),
                ],
            )
        ]


def _float(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise FieldError(name, "must be a number") from None


def console_routes(deps: ConsoleDeps) -> list[BaseRoute]:
    """The `/admin/ui` mount, for the app factory's extra routes."""
    return ConsoleRoutes(deps).routes()
