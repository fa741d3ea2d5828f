"""The console's pages and actions under /admin/ui.

Every page needs a console session (a cookie set at login with the admin token); without one a
page redirects to the login form, a JSON endpoint answers 401 and an action 403. Every POST
carries the session's CSRF token (403 without it). Actions call the repository and the rollout
in-process, as the admin API does, and are audited by them with the actor `admin-console <addr>`.
Errors are shown on the page they came from, with the status the admin API would answer.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from weir.engine.request import Priority
from weir.gateway.console.base import (
    CONSOLE_ERRORS,
    HERE,
    LOGIN_COOKIE,
    PREFIX,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    STATIC_ASSETS,
    ConsoleDeps,
    client_addr,
    engine_rows,
    is_https,
)
from weir.gateway.console.forms import optional_int, read_form
from weir.gateway.console.key_pages import KeyPages
from weir.gateway.console.model_pages import ModelPages
from weir.gateway.console.sessions import ConsoleSession
from weir.gateway.console.usage_pages import UsagePages
from weir.gateway.http.errors import NotFoundError, WeirError, to_http_error
from weir.tenancy.admin_bodies.keys import ApiKey, KeyCreate
from weir.tenancy.admin_bodies.tenants import TenantCreate, TenantPatch
from weir.tenancy.errors import FieldError
from weir.tenancy.keys.keys import is_public_id
from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import INT_QUOTA_FIELDS, parse_quota_limits
from weir.tenancy.store.enums import KeyScope
from weir.tenancy.store.field_rules import validate_tenant_name

logger = logging.getLogger(__name__)

TENANTS_PER_PAGE = 100


class ConsoleRoutes(UsagePages, ModelPages, KeyPages):
    """The console's endpoints over `ConsoleDeps`."""

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
            secure=is_https(request),
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
            await self.deps.admin_auth.authenticate_async(f"Bearer {token}", client_addr(request))
        except WeirError as exc:
            response = self._login_page(request, exc.message, exc.status_code)
            response.headers.update(exc.headers)
            return response
        session = self.sessions.create()
        logger.info("admin console login from %s", client_addr(request))
        response = RedirectResponse(f"{PREFIX}/tenants", 303, headers=SECURITY_HEADERS)
        response.set_cookie(
            SESSION_COOKIE,
            session.session_id,
            max_age=int(self.sessions.ttl_s),
            path=PREFIX,
            secure=is_https(request),
            httponly=True,
            samesite="strict",
        )
        response.delete_cookie(LOGIN_COOKIE, path=PREFIX)
        return response

    async def logout(self, request: Request, session: ConsoleSession) -> Response:
        self.sessions.end(session.session_id)
        response = RedirectResponse(f"{PREFIX}/login", 303, headers=SECURITY_HEADERS)
        response.delete_cookie(
            SESSION_COOKIE, path=PREFIX, secure=is_https(request), httponly=True, samesite="strict"
        )
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_ASSETS:
            raise NotFoundError("no such console asset")
        return FileResponse(
            HERE / "static" / name,
            media_type=STATIC_ASSETS[name],
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )

    async def home(self, request: Request, session: ConsoleSession) -> Response:
        return RedirectResponse(f"{PREFIX}/tenants", 303, headers=SECURITY_HEADERS)

    # -- tenants ----------------------------------------------------------------------------------

    async def tenants(
        self, request: Request, session: ConsoleSession, error: str | None = None, status_code: int = 200
    ) -> Response:
        query = request.query_params.get("q", "")[:128]
        try:
            offset = max(0, optional_int(dict(request.query_params), "offset") or 0)
        except FieldError:
            offset = 0
        shown, matching = await run_in_threadpool(
            lambda: self.repo.search_tenants(query, limit=TENANTS_PER_PAGE, offset=offset)
        )
        return self.render(
            "tenants.html",
            status_code,
            session,
            nav="tenants",
            tenants=shown,
            matching=matching,
            offset=offset,
            per_page=TENANTS_PER_PAGE,
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
        except CONSOLE_ERRORS as exc:
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
        except CONSOLE_ERRORS as exc:
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
        except CONSOLE_ERRORS as exc:
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
        except CONSOLE_ERRORS as exc:
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
        except CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return self.render("error.html", error.status_code, session, error=error.message, nav="tenants")
        self.deps.authenticator.invalidate(key_id)
        return RedirectResponse(f"{PREFIX}/tenants/{key.tenant}", 303, headers=SECURITY_HEADERS)

    # -- live engine ------------------------------------------------------------------------------

    def _tenant_rows(self) -> list[dict[str, str]] | None:
        if self.live_tenants is None:
            return None
        return [row.cells() for row in self.live_tenants.rows()]

    async def engine(self, request: Request, session: ConsoleSession) -> Response:
        rows = engine_rows(self.deps.stats_by_version())
        return self.render(
            "engine.html", 200, session, nav="engine", rows=rows, tenant_rows=self._tenant_rows()
        )

    async def engine_json(self, request: Request, session: ConsoleSession) -> Response:
        body = {"data": engine_rows(self.deps.stats_by_version()), "tenants": self._tenant_rows() or []}
        return JSONResponse(body, headers=SECURITY_HEADERS)

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
        except CONSOLE_ERRORS as exc:
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
                    Route("/keys/{key_id}", page(self.key), methods=["GET"]),
                    Route("/keys/{key_id}/limits", action(self.set_key_limits), methods=["POST"]),
                    Route("/keys/{key_id}/revoke", action(self.revoke_key), methods=["POST"]),
                    Route("/engine", page(self.engine), methods=["GET"]),
                    Route("/engine.json", data(self.engine_json), methods=["GET"]),
                    Route("/audit", page(self.audit), methods=["GET"]),
                    Route("/usage", page(self.usage), methods=["GET"]),
                    Route("/usage.csv", page(self.usage_csv), methods=["GET"]),
                    Route("/models", page(self.models), methods=["GET"]),
                    Route("/models", action(self.register), methods=["POST"]),
                    Route("/models/{name}/versions", action(self.version_op), methods=["POST"]),
                    Route("/models/{name}/traffic", action(self.set_traffic), methods=["POST"]),
                    Route("/models/{name}/pins", action(self.set_pin), methods=["POST"]),
                    Route("/models/{name}/rollback", action(self.rollback), methods=["POST"]),
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
