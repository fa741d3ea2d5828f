"""The admin operations behind `weir admin ...`, against the database or a running server.

Both backends return the same JSON objects as the admin API (rendered, or checked, by the
models of `weir.tenancy.admin_bodies`), so the CLI prints the same thing either way. The direct backend is for operators on the database host (and for a server that
is down); the HTTP backend goes through /admin/v1 and so invalidates the server's auth cache
at once, where a direct change reaches running servers only within their cache TTL.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from weir.tenancy.admin_bodies.audit import AuditEvent, AuditList
from weir.tenancy.admin_bodies.keys import ApiKey, ApiKeyList, IssuedApiKey, KeyCreate
from weir.tenancy.admin_bodies.quota import key_limits_body, quota_json
from weir.tenancy.admin_bodies.tenants import Tenant, TenantCreate, TenantList, TenantPatch
from weir.tenancy.admin_bodies.usage import TenantUsage, UsageReportBody
from weir.tenancy.context import QuotaLimits
from weir.tenancy.errors import TenancyError
from weir.tenancy.parsing import parse_model
from weir.tenancy.repository.records import KeySpec, TenantSpec, TenantUpdate
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.usage.usage_report import ReportQuery, report_params

JsonObject = dict[str, Any]

CLI_ACTOR = "cli"


def path_segment(value: str) -> str:
    """A URL path segment from user input, quoted so nothing in it can change the route."""
    return quote(value, safe="")


def _dump(body: BaseModel, request: bool = False) -> JsonObject:
    """A body as JSON; a request body without its unset (null) optional fields."""
    return body.model_dump(mode="json", exclude_none=request)


class AdminApiError(TenancyError):
    """The server refused an admin request; carries its HTTP status and error message."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


class AdminBackend(Protocol):
    """The admin operations; each returns the admin API's JSON object for the result."""

    def create_tenant(self, spec: TenantSpec) -> JsonObject: ...
    def list_tenants(self) -> JsonObject: ...
    def get_tenant(self, name: str) -> JsonObject: ...
    def update_tenant(self, name: str, change: TenantUpdate) -> JsonObject: ...
    def suspend_tenant(self, name: str) -> JsonObject: ...
    def set_quota(self, name: str, quota: QuotaLimits) -> JsonObject: ...
    def issue_key(self, tenant: str, spec: KeySpec) -> JsonObject: ...
    def list_keys(self, tenant: str) -> JsonObject: ...
    def revoke_key(self, key_id: str) -> JsonObject: ...
    def rotate_key(self, key_id: str) -> JsonObject: ...
    def set_key_limits(self, key_id: str, limits: QuotaLimits) -> JsonObject: ...
    def usage(self, tenant: str, since: dt.date | None, until: dt.date | None) -> JsonObject: ...
    def usage_report(self, query: ReportQuery) -> JsonObject: ...
    def audit(self, tenant: str | None, limit: int) -> JsonObject: ...


class DirectAdmin:
    """Admin operations straight on the database through the repository."""

    def __init__(self, repo: TenancyRepo, actor: str = CLI_ACTOR) -> None:
        self.repo = repo
        self.actor = actor

    def create_tenant(self, spec: TenantSpec) -> JsonObject:
        return _dump(Tenant.model_validate(self.repo.create_tenant(spec, actor=self.actor)))

    def list_tenants(self) -> JsonObject:
        return _dump(TenantList(data=[Tenant.model_validate(t) for t in self.repo.list_tenants()]))

    def get_tenant(self, name: str) -> JsonObject:
        return _dump(Tenant.model_validate(self.repo.get_tenant(name)))

    def update_tenant(self, name: str, change: TenantUpdate) -> JsonObject:
        return _dump(Tenant.model_validate(self.repo.update_tenant(name, change, actor=self.actor)))

    def suspend_tenant(self, name: str) -> JsonObject:
        return _dump(Tenant.model_validate(self.repo.suspend_tenant(name, actor=self.actor)))

    def set_quota(self, name: str, quota: QuotaLimits) -> JsonObject:
        return _dump(Tenant.model_validate(self.repo.set_quota(name, quota, actor=self.actor)))

    def issue_key(self, tenant: str, spec: KeySpec) -> JsonObject:
        return _dump(
            IssuedApiKey.issued(self.repo.issue_key(tenant, spec, actor=self.actor), self.repo.now())
        )

    def list_keys(self, tenant: str) -> JsonObject:
        now = self.repo.now()
        return _dump(ApiKeyList(data=[ApiKey.of(k, now) for k in self.repo.list_keys(tenant)]))

    def revoke_key(self, key_id: str) -> JsonObject:
        return _dump(ApiKey.of(self.repo.revoke_key(key_id, actor=self.actor), self.repo.now()))

    def rotate_key(self, key_id: str) -> JsonObject:
        return _dump(IssuedApiKey.issued(self.repo.rotate_key(key_id, actor=self.actor), self.repo.now()))

    def set_key_limits(self, key_id: str, limits: QuotaLimits) -> JsonObject:
        return _dump(ApiKey.of(self.repo.set_key_limits(key_id, limits, actor=self.actor), self.repo.now()))

    def usage(self, tenant: str, since: dt.date | None, until: dt.date | None) -> JsonObject:
        return _dump(TenantUsage.of(tenant, self.repo.usage_by_day(tenant, since=since, until=until)))

    def usage_report(self, query: ReportQuery) -> JsonObject:
        return UsageReportBody.of(self.repo.usage_report(query)).json_body()

    def audit(self, tenant: str | None, limit: int) -> JsonObject:
        return _dump(
            AuditList(
                data=[AuditEvent.model_validate(e) for e in self.repo.list_audit(tenant=tenant, limit=limit)]
            )
        )


class HttpAdmin:
    """Admin operations through a running server's /admin/v1 API."""

    def __init__(self, client: httpx.Client) -> None:
        # The client carries the base URL and the admin bearer token (see `connect`).
        self.client = client

    @classmethod
    def connect(cls, server_url: str, admin_token: str, *, timeout_s: float = 30.0) -> HttpAdmin:
        """A backend for the server at `server_url` (e.g. http://127.0.0.1:8000)."""
        client = httpx.Client(
            base_url=server_url.rstrip("/"),
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=timeout_s,
        )
        return cls(client)

    def close(self) -> None:
        self.client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
        answer: type[BaseModel] | None = None,
    ) -> JsonObject:
        """One admin request (`path` under /admin/v1); the answer's JSON object (checked against
        the `answer` model: a server speaking another shape is reported, not echoed), or
        `AdminApiError` with the server's message. `timeout_s` None: the client's timeout."""
        url = "/admin/v1" + path
        if timeout_s is None:
            response = self.client.request(method, url, json=json, params=params)
        else:
            response = self.client.request(method, url, json=json, params=params, timeout=timeout_s)
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            message = response.text
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                message = str(body["error"].get("message", message))
            raise AdminApiError(response.status_code, message)
        if not isinstance(body, dict):
            raise AdminApiError(response.status_code, "the server did not answer with a JSON object")
        if answer is not None:
            parse_model(answer, body, "answer")
        return body

    def create_tenant(self, spec: TenantSpec) -> JsonObject:
        return self.call(
            "POST", "/tenants", json=_dump(TenantCreate.model_validate(spec), True), answer=Tenant
        )

    def list_tenants(self) -> JsonObject:
        return self.call("GET", "/tenants", answer=TenantList)

    def get_tenant(self, name: str) -> JsonObject:
        return self.call("GET", f"/tenants/{path_segment(name)}", answer=Tenant)

    def update_tenant(self, name: str, change: TenantUpdate) -> JsonObject:
        body = _dump(TenantPatch.model_validate(change), True)
        return self.call("PATCH", f"/tenants/{path_segment(name)}", json=body, answer=Tenant)

    def suspend_tenant(self, name: str) -> JsonObject:
        return self.call("POST", f"/tenants/{path_segment(name)}/suspend", answer=Tenant)

    def set_quota(self, name: str, quota: QuotaLimits) -> JsonObject:
        return self.call("PUT", f"/tenants/{path_segment(name)}/quota", json=quota_json(quota), answer=Tenant)

    def issue_key(self, tenant: str, spec: KeySpec) -> JsonObject:
        body = _dump(KeyCreate.model_validate(spec))
        return self.call("POST", f"/tenants/{path_segment(tenant)}/keys", json=body, answer=IssuedApiKey)

    def list_keys(self, tenant: str) -> JsonObject:
        return self.call("GET", f"/tenants/{path_segment(tenant)}/keys", answer=ApiKeyList)

    def revoke_key(self, key_id: str) -> JsonObject:
        return self.call("DELETE", f"/keys/{path_segment(key_id)}", answer=ApiKey)

    def rotate_key(self, key_id: str) -> JsonObject:
        return self.call("POST", f"/keys/{path_segment(key_id)}/rotate", answer=IssuedApiKey)

    def set_key_limits(self, key_id: str, limits: QuotaLimits) -> JsonObject:
        body = _dump(key_limits_body(limits))
        return self.call("PUT", f"/keys/{path_segment(key_id)}/limits", json=body, answer=ApiKey)

    def usage(self, tenant: str, since: dt.date | None, until: dt.date | None) -> JsonObject:
        params = {}
        if since is not None:
            params["since"] = since.isoformat()
        if until is not None:
            params["until"] = until.isoformat()
        return self.call("GET", f"/tenants/{path_segment(tenant)}/usage", params=params, answer=TenantUsage)

    def usage_report(self, query: ReportQuery) -> JsonObject:
        return self.call("GET", "/usage/report", params=report_params(query), answer=UsageReportBody)

    def audit(self, tenant: str | None, limit: int) -> JsonObject:
        params = {"limit": str(limit)}
        if tenant is not None:
            params["tenant"] = tenant
        return self.call("GET", "/audit", params=params, answer=AuditList)
