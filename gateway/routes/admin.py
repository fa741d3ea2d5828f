"""The admin API under /admin/v1 (admin bearer token) and the tenant's own GET /v1/usage.

Every admin action is audited by the repository in the same transaction. Changes made here
invalidate this replica's auth cache at once; other replicas see them within the cache TTL.
Repository calls are synchronous and run in the thread pool.

Body errors: a body that is not a JSON object is 400; a field that is unknown, of the wrong
type or out of range is 422 with `param` naming the field. Errors are raised, and answered (and
counted) by the app's handlers, `weir.gateway.http.errors.exception_handlers`.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.allowed_methods import allowed_methods
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.errors import (
    BadRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PermissionDeniedError,
)
from weir.gateway.routes.admin_http import (
    NO_STORE,
    AdminHandler,
    Endpoint,
    admin_endpoint,
    client_addr,
    json_answer,
    named_in_path,
    read_json_body,
)
from weir.tenancy.admin_bodies.audit import AuditEvent, AuditList
from weir.tenancy.admin_bodies.keys import ApiKey, ApiKeyList, IssuedApiKey, KeyCreate
from weir.tenancy.admin_bodies.quota import parse_key_limits
from weir.tenancy.admin_bodies.stored_responses import StoredResponsesView
from weir.tenancy.admin_bodies.tenants import Tenant, TenantCreate, TenantList, TenantPatch
from weir.tenancy.admin_bodies.usage import TenantUsage, UsageReportBody
from weir.tenancy.admin_bodies.usage_query import AuditQuery, UsageQuery, parse_report_params
from weir.tenancy.keys.keys import is_public_id
from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import parse_quota_limits
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.responses.response_records import ResponseStore, tenant_storage_limits
from weir.tenancy.responses.response_repo import DatabaseResponseStore
from weir.tenancy.store.enums import KeyScope
from weir.tenancy.store.field_rules import validate_tenant_name
from weir.tenancy.usage.usage_report import report_csv

MAX_ADMIN_BODY_BYTES = 1 << 20


async def _body(request: Request) -> Any:
    return await read_json_body(request, MAX_ADMIN_BODY_BYTES)


def _tenant_param(request: Request) -> str:
    return named_in_path(
        request, "name", validate_tenant_name, lambda name: NotFoundError(f"tenant {name!r} not found")
    )


def _key_param(request: Request) -> str:
    key_id = request.path_params["key_id"]
    if not is_public_id(key_id):
        raise NotFoundError(f"API key {key_id!r} not found")
    return str(key_id)


def _usage_query(request: Request) -> UsageQuery:
    """`since` / `until`; each may be a valid day, but an empty range is a bad request (400)."""
    query = parse_model(UsageQuery, dict(request.query_params))
    if query.since is not None and query.until is not None and query.since > query.until:
        raise BadRequestError(
            f"since ({query.since}) must not be after until ({query.until})",
            param="since",
            code="invalid_value",
        )
    return query


class _AdminApi:
    """The endpoints, sharing the repository and the two authenticators."""

    def __init__(
        self,
        repo: TenancyRepo,
        authenticator: Authenticator,
        admin_auth: AdminAuthenticator,
        responses: ResponseStore,
    ) -> None:
        self.repo = repo
        self.auth = authenticator
        self.admin_auth = admin_auth
        self.responses = responses

    def admin(self, handler: AdminHandler) -> Endpoint:
        """Wrap an admin endpoint: check the admin token; the handler gets the actor."""
        return admin_endpoint(self.admin_auth, handler)

    # -- tenants ---------------------------------------------------------------------------------

    async def create_tenant(self, request: Request, actor: str) -> Response:
        spec = parse_model(TenantCreate, await _body(request)).spec()
        tenant = await run_in_threadpool(lambda: self.repo.create_tenant(spec, actor=actor))
        return json_answer(Tenant.model_validate(tenant), 201)

    async def list_tenants(self, request: Request, actor: str) -> Response:
        tenants = await run_in_threadpool(self.repo.list_tenants)
        return json_answer(TenantList(data=[Tenant.model_validate(t) for t in tenants]))

    async def get_tenant(self, request: Request, actor: str) -> Response:
        tenant = await run_in_threadpool(self.repo.get_tenant, _tenant_param(request))
        return json_answer(Tenant.model_validate(tenant))

    async def update_tenant(self, request: Request, actor: str) -> Response:
        name = _tenant_param(request)
        change = parse_model(TenantPatch, await _body(request)).update()
        tenant = await run_in_threadpool(lambda: self.repo.update_tenant(name, change, actor=actor))
        self.auth.invalidate_tenant(name)
        return json_answer(Tenant.model_validate(tenant))

    async def suspend_tenant(self, request: Request, actor: str) -> Response:
        name = _tenant_param(request)
        tenant = await run_in_threadpool(lambda: self.repo.suspend_tenant(name, actor=actor))
        self.auth.invalidate_tenant(name)
        return json_answer(Tenant.model_validate(tenant))

    async def set_quota(self, request: Request, actor: str) -> Response:
        name = _tenant_param(request)
        body = await _body(request)
        quota = parse_quota_limits(body, where="body")
        tenant = await run_in_threadpool(lambda: self.repo.set_quota(name, quota, actor=actor))
        self.auth.invalidate_tenant(name)
        return json_answer(Tenant.model_validate(tenant))

    # -- keys ------------------------------------------------------------------------------------

    async def issue_key(self, request: Request, actor: str) -> Response:
        name = _tenant_param(request)
        body = await _body(request)
        spec = parse_model(KeyCreate, {} if body is None else body).spec()
        issued = await run_in_threadpool(lambda: self.repo.issue_key(name, spec, actor=actor))
        return json_answer(IssuedApiKey.issued(issued, self.repo.now()), 201)

    async def list_keys(self, request: Request, actor: str) -> Response:
        keys = await run_in_threadpool(self.repo.list_keys, _tenant_param(request))
        now = self.repo.now()
        return json_answer(ApiKeyList(data=[ApiKey.of(k, now) for k in keys]))

    async def revoke_key(self, request: Request, actor: str) -> Response:
        key_id = _key_param(request)
        key = await run_in_threadpool(lambda: self.repo.revoke_key(key_id, actor=actor))
        self.auth.invalidate(key_id)
        return json_answer(ApiKey.of(key, self.repo.now()))

    async def get_key(self, request: Request, actor: str) -> Response:
        key = await run_in_threadpool(self.repo.get_key, _key_param(request))
        return json_answer(ApiKey.of(key, self.repo.now()))

    async def set_key_limits(self, request: Request, actor: str) -> Response:
        key_id = _key_param(request)
        limits = parse_key_limits(await _body(request))
        key = await run_in_threadpool(lambda: self.repo.set_key_limits(key_id, limits, actor=actor))
        self.auth.invalidate(key_id)
        return json_answer(ApiKey.of(key, self.repo.now()))

    async def rotate_key(self, request: Request, actor: str) -> Response:
        key_id = _key_param(request)
        issued = await run_in_threadpool(lambda: self.repo.rotate_key(key_id, actor=actor))
        self.auth.invalidate(key_id)
        return json_answer(IssuedApiKey.issued(issued, self.repo.now()), 201)

    # -- usage and audit -------------------------------------------------------------------------

    async def tenant_usage(self, request: Request, actor: str) -> Response:
        name = _tenant_param(request)
        q = _usage_query(request)
        days = await run_in_threadpool(
            lambda: self.repo.usage_by_day(name, since=q.since, until=q.until, endpoint=q.endpoint)
        )
        return json_answer(TenantUsage.of(name, days))

    async def stored_responses(self, request: Request, actor: str) -> Response:
        """GET /admin/v1/tenants/{name}/stored-responses: bytes held against the quota, retention."""
        name = _tenant_param(request)
        tenant = await run_in_threadpool(self.repo.get_tenant, name)  # 404 for an unknown tenant
        used = await run_in_threadpool(self.responses.bytes_used, name, self.repo.now())
        limits = tenant_storage_limits(self.responses.limits, tenant.quota)  # its own, else the server's
        return json_answer(
            StoredResponsesView(
                tenant=name, bytes_used=used, quota_bytes=limits.quota_bytes, retention_s=limits.retention_s
            )
        )

    async def usage_report(self, request: Request, actor: str) -> Response:
        """GET /admin/v1/usage/report: grouped usage over a time range, one page, JSON or CSV."""
        query, fmt = parse_report_params(dict(request.query_params))
        report = await run_in_threadpool(lambda: self.repo.usage_report(query))
        body = UsageReportBody.of(report).json_body()
        if fmt == "json":
            return JSONResponse(body, headers=NO_STORE)
        headers = {**NO_STORE, "Content-Disposition": 'attachment; filename="usage-report.csv"'}
        if report.next_offset is not None:
            headers["Weir-Next-Offset"] = str(report.next_offset)
        return PlainTextResponse(report_csv(body), media_type="text/csv", headers=headers)

    async def audit(self, request: Request, actor: str) -> Response:
        q = parse_model(AuditQuery, dict(request.query_params))
        events = await run_in_threadpool(
            lambda: self.repo.list_audit(tenant=q.tenant, limit=q.limit, before_id=q.before)
        )
        return json_answer(AuditList(data=[AuditEvent.model_validate(e) for e in events]))

    async def unknown(self, request: Request, actor: str) -> Response:
        # Reached only with a valid admin token: probes without one get 401, not a route map.
        if allowed_methods(request.app.router.routes, request.scope, catch_all=False):
            # A path another admin route serves, with another method (the handler adds Allow).
            raise MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}")
        raise NotFoundError(f"no admin endpoint {request.method} {request.url.path}")

    async def own_usage(self, request: Request) -> Response:
        """GET /v1/usage: the calling tenant's usage, and only its own."""
        context = await self.auth.authenticate_async(
            request.headers.get("authorization"), client_addr(request), scope=KeyScope.USAGE
        )
        asked = request.query_params.get("tenant")
        if asked is not None and asked != context.tenant_id:
            raise PermissionDeniedError("An API key can only read its own tenant's usage.", param="tenant")
        q = _usage_query(request)
        days = await run_in_threadpool(
            lambda: self.repo.usage_by_day(
                context.tenant_id, since=q.since, until=q.until, endpoint=q.endpoint
            )
        )
        return json_answer(TenantUsage.of(context.tenant_id, days))


def admin_routes(
    repo: TenancyRepo,
    authenticator: Authenticator,
    admin_auth: AdminAuthenticator,
    responses: ResponseStore | None = None,
) -> list[BaseRoute]:
    """The `/admin/v1/...` mount and the tenant's `/v1/usage` route, for the app factory to mount.
    `responses`: the stored responses the tenants' views count (the database's, by default)."""
    api = _AdminApi(repo, authenticator, admin_auth, responses or DatabaseResponseStore(repo.db))
    a = api.admin
    return [
        Mount(
            "/admin/v1",
            routes=[
                Route("/tenants", a(api.create_tenant), methods=["POST"]),
                Route("/tenants", a(api.list_tenants), methods=["GET"]),
                Route("/tenants/{name}", a(api.get_tenant), methods=["GET"]),
                Route("/tenants/{name}", a(api.update_tenant), methods=["PATCH"]),
                Route("/tenants/{name}/suspend", a(api.suspend_tenant), methods=["POST"]),
                Route("/tenants/{name}/quota", a(api.set_quota), methods=["PUT"]),
                Route("/tenants/{name}/keys", a(api.issue_key), methods=["POST"]),
                Route("/tenants/{name}/keys", a(api.list_keys), methods=["GET"]),
                Route("/tenants/{name}/usage", a(api.tenant_usage), methods=["GET"]),
                Route("/tenants/{name}/stored-responses", a(api.stored_responses), methods=["GET"]),
                Route("/keys/{key_id}", a(api.revoke_key), methods=["DELETE"]),
                Route("/keys/{key_id}", a(api.get_key), methods=["GET"]),
                Route("/keys/{key_id}/limits", a(api.set_key_limits), methods=["PUT"]),
                Route("/keys/{key_id}/rotate", a(api.rotate_key), methods=["POST"]),
                Route("/usage/report", a(api.usage_report), methods=["GET"]),
                Route("/audit", a(api.audit), methods=["GET"]),
                Route("/{path:path}", a(api.unknown), methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
        ),
        Route("/v1/usage", api.own_usage, methods=["GET"]),
    ]
