"""The console's page for one API key: its metadata and its own limits (nested in its tenant's).

`GET /keys/{id}` shows the key (never its secret) with a form of its limits; `POST
/keys/{id}/limits` replaces them through the same codec and repository call as `PUT
/admin/v1/keys/{id}/limits`, and invalidates the key's cached context at once.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from weir.gateway.console.base import CONSOLE_ERRORS, ConsoleBase
from weir.gateway.console.forms import optional_int
from weir.gateway.console.sessions import ConsoleSession
from weir.gateway.http.errors import NotFoundError, to_http_error
from weir.tenancy.admin_bodies.keys import ApiKey
from weir.tenancy.admin_bodies.quota import parse_key_limits
from weir.tenancy.context import KEY_LIMIT_FIELDS
from weir.tenancy.keys.keys import is_public_id

INT_KEY_LIMIT_FIELDS = tuple(f for f in KEY_LIMIT_FIELDS if f != "models")


class KeyPages(ConsoleBase):
    """One key's page and its limits form."""

    @staticmethod
    def _key_id(request: Request) -> str:
        key_id = request.path_params["key_id"]
        if not is_public_id(key_id):
            raise NotFoundError(f"API key {key_id!r} not found")
        return str(key_id)

    async def key(
        self,
        request: Request,
        session: ConsoleSession,
        error: str | None = None,
        status_code: int = 200,
        notice: str | None = None,
    ) -> Response:
        key_id = self._key_id(request)
        try:
            key = await run_in_threadpool(self.repo.get_key, key_id)
            tenant = await run_in_threadpool(self.repo.get_tenant, key.tenant)
        except CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="tenants")
        return self.render(
            "key.html",
            status_code,
            session,
            nav="tenants",
            key=ApiKey.of(key, self.repo.now()).model_dump(mode="json"),
            limit_fields=INT_KEY_LIMIT_FIELDS,
            tenant_quota=tenant.quota.as_dict(),
            form=getattr(request.state, "form", None),
            error=error,
            notice=notice,
        )

    async def set_key_limits(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form
        key_id = self._key_id(request)
        try:
            body: dict[str, Any] = {f: optional_int(form, f) for f in INT_KEY_LIMIT_FIELDS}
            models = [m.strip() for m in form.get("models", "").split(",") if m.strip()]
            body["models"] = models or None
            limits = parse_key_limits(body)
            await run_in_threadpool(
                lambda: self.repo.set_key_limits(key_id, limits, actor=self._actor(request))
            )
        except CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.key(request, session, error.message, error.status_code)
        self.deps.authenticator.invalidate(key_id)
        request.state.form = None  # show what was stored, not what was sent
        return await self.key(request, session, notice="Key limits saved.")
