"""The LoRA adapter admin API under /admin/v1/adapters (admin bearer token).

    GET  /admin/v1/adapters[?model_version=name@version]   every adapter: record, access, runtime
    POST /admin/v1/adapters                                 register {"name", "model_version", "path", "owner_tenant"}: 201
    GET  /admin/v1/adapters/{name}                          one adapter
    POST /admin/v1/adapters/{name}/load                     load on its base version's engine: 200 loaded;
                                                            400 invalid_adapter (refused, recorded failed)
    POST /admin/v1/adapters/{name}/unload                   stop routing, let its requests finish, free it
    POST /admin/v1/adapters/{name}/retire                   unload if loaded; never loaded again
    POST /admin/v1/adapters/{name}/grant                    {"tenant"}: add to the access list
    POST /admin/v1/adapters/{name}/revoke                   {"tenant"}: take off the access list

Bodies are `weir.gateway.api.adapter_admin_bodies`' pydantic models; every change is audited by the
repository; errors map in `weir.gateway.http.errors` (unknown adapter 404, a move the state does not allow
or a base version that is not ready 409, a refused adapter folder 400).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from weir.gateway.api.adapter_admin_bodies import (
    AdapterAccessBody,
    AdapterListOut,
    AdapterOut,
    AdapterRegisterBody,
)
from weir.gateway.fleet.adapter_rollout import AdapterRollout, AdapterStatus
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import NotFoundError
from weir.gateway.routes.admin_http import (
    AdminHandler,
    AdminRoutes,
    bounded_query,
    json_answer,
    named_in_path,
)
from weir.tenancy.catalog.adapter_records import validate_adapter_name
from weir.tenancy.parsing import parse_model
from weir.tenancy.store.field_rules import validate_tenant_name


def _one(status: AdapterStatus, status_code: int = 200) -> Response:
    return json_answer(AdapterOut.model_validate(status), status_code)


def _missing(name: str) -> NotFoundError:
    return NotFoundError(f"adapter {name[:200]!r} does not exist", code="adapter_not_found")


def _name(request: Request) -> str:
    return named_in_path(request, "name", validate_adapter_name, _missing)


class AdaptersAdminRoutes(AdminRoutes):
    """The endpoints over one `AdapterRollout`, behind the admin token."""

    max_body_bytes = 64 << 10
    blank_is_empty_object = True

    def __init__(self, rollout: AdapterRollout, admin_auth: AdminAuthenticator) -> None:
        super().__init__(admin_auth)
        self.rollout = rollout

    def endpoints(self) -> list[tuple[str, str, AdminHandler]]:
        base = "/admin/v1/adapters"
        # {name:path}: adapter names may hold '/', like model names on the OpenAI side.
        one = base + "/{name:path}"
        return [
            ("GET", base, self.list_adapters),
            ("POST", base, self.register),
            *self.actions(
                one,
                {
                    "load": self.load,
                    "unload": self.unload,
                    "retire": self.retire,
                    "grant": self.grant,
                    "revoke": self.revoke,
                },
            ),
            ("GET", one, self.get_adapter),
        ]

    async def list_adapters(self, request: Request, actor: str) -> Response:
        statuses = await self.rollout.list(bounded_query(request, "model_version"))
        return json_answer(AdapterListOut(data=[AdapterOut.model_validate(s) for s in statuses]))

    async def register(self, request: Request, actor: str) -> Response:
        body = parse_model(AdapterRegisterBody, await self.body(request))
        return _one(await self.rollout.register(body.spec(), actor), 201)

    async def get_adapter(self, request: Request, actor: str) -> Response:
        return _one(await self.rollout.get(_name(request)))

    async def load(self, request: Request, actor: str) -> Response:
        return _one(await self.rollout.load(_name(request), actor))

    async def unload(self, request: Request, actor: str) -> Response:
        return _one(await self.rollout.unload(_name(request), actor))

    async def retire(self, request: Request, actor: str) -> Response:
        return _one(await self.rollout.retire(_name(request), actor))

    async def grant(self, request: Request, actor: str) -> Response:
        name = _name(request)
        tenant = validate_tenant_name(
            parse_model(AdapterAccessBody, await self.body(request)).tenant, "tenant"
        )
        return _one(await self.rollout.grant(name, tenant, actor))

    async def revoke(self, request: Request, actor: str) -> Response:
        name = _name(request)
        tenant = validate_tenant_name(
            parse_model(AdapterAccessBody, await self.body(request)).tenant, "tenant"
        )
        return _one(await self.rollout.revoke(name, tenant, actor))


def adapters_admin_routes(rollout: AdapterRollout, admin_auth: AdminAuthenticator) -> list[BaseRoute]:
    """The `/admin/v1/adapters` routes; place them before the `/admin/v1` catch-all."""
    return AdaptersAdminRoutes(rollout, admin_auth).routes()
