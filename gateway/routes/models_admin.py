"""The model-version admin API under /admin/v1/models (admin bearer token).

    GET  /admin/v1/models                                      every version with state, share, in flight, KV use
    POST /admin/v1/models                                      register {"name", "version", "path", ...}: 201
    POST /admin/v1/models/{name}/versions/{version}/load       load + warm up: 200 ready, else 422 with the reason
    PUT  /admin/v1/models/{name}/traffic                       {"split": {...}, "pins": {...}}
    POST /admin/v1/models/{name}/versions/{version}/drain      no new requests; in-flight ones finish
    POST /admin/v1/models/{name}/versions/{version}/retire     after the drain: unload, free memory and blocks

A drain or retire that would leave the model with no ready version is refused with 409
`last_serving_version` unless forced (`{"force": true}` or `?force=true`); see
`weir.tenancy.catalog.rollout_guards`.
    POST /admin/v1/models/{name}/rollback                      {"to": "<version>"}: split back, drain the others

Bodies and answers are `weir.tenancy.admin_bodies.model_versions`'s models (the `weir admin models` client reads the same
shapes). Every change is audited by the repository. A retire's answer also carries the budget
released and the memory measured as freed, in `x-weir-memory-released-bytes` and
`x-weir-memory-freed-bytes` (the version object's fields are fixed by its model).
"""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from weir.gateway.fleet.model_rollout import ModelRollout, VersionStatus
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import NotFoundError, UnprocessableError
from weir.gateway.routes.admin_http import AdminHandler, AdminRoutes, json_answer, named_in_path
from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionList,
    TrafficPlanBody,
    VersionRuntime,
    parse_rollback,
    parse_spec,
    parse_traffic,
    parse_version_action,
)
from weir.tenancy.catalog.model_version_records import validate_model_name, validate_version_label


def _name(request: Request) -> str:
    return named_in_path(
        request,
        "name",
        validate_model_name,
        lambda name: NotFoundError(
            f"model {name!r} has no registered version", code="model_version_not_found"
        ),
    )


def _version(request: Request) -> str:
    return named_in_path(
        request,
        "version",
        validate_version_label,
        lambda version: NotFoundError(f"no model version {version!r}", code="model_version_not_found"),
    )


def status_body(status: VersionStatus) -> ModelVersion:
    """A version object: the record with the runtime's state, share, pins, in-flight and KV use."""
    view = dataclasses.replace(status.record, state=status.state, failure_reason=status.failure_reason)
    body = ModelVersion.of(view, None, VersionRuntime(in_flight=status.in_flight, kv_usage=status.kv_usage))
    return body.model_copy(
        update={"traffic_percent": status.traffic_percent, "pinned_tenants": list(status.pinned_tenants)}
    )


class ModelsAdminRoutes(AdminRoutes):
    """The endpoints over one `ModelRollout`, behind the admin token."""

    blank_is_empty_object = True

    def __init__(self, rollout: ModelRollout, admin_auth: AdminAuthenticator) -> None:
        super().__init__(admin_auth)
        self.rollout = rollout

    def endpoints(self) -> list[tuple[str, str, AdminHandler]]:
        base = "/admin/v1/models"
        version = base + "/{name}/versions/{version}"
        return [
            ("GET", base, self.list_models),
            ("POST", base, self.register),
            *self.actions(version, {"load": self.load, "drain": self.drain, "retire": self.retire}),
            ("PUT", base + "/{name}/traffic", self.set_traffic),
            ("POST", base + "/{name}/rollback", self.rollback),
        ]

    async def _force(self, request: Request) -> bool:
        return parse_version_action(await self.body(request), request.query_params.get("force"))

    async def list_models(self, request: Request, actor: str) -> Response:
        statuses, plans = await self.rollout.list()
        return json_answer(ModelVersionList.of([status_body(s) for s in statuses], plans))

    async def register(self, request: Request, actor: str) -> Response:
        spec = parse_spec(await self.body(request))
        return json_answer(status_body(await self.rollout.register(spec, actor)), 201)

    async def load(self, request: Request, actor: str) -> Response:
        status = await self.rollout.load(_name(request), _version(request), actor)
        if status.failure_reason is not None or status.state.value != "ready":
            raise UnprocessableError(
                f"loading model version {status.record.id} failed: {status.failure_reason}",
                param="path",
                code="model_load_failed",
            )
        return json_answer(status_body(status))

    async def set_traffic(self, request: Request, actor: str) -> Response:
        plan = parse_traffic(_name(request), await self.body(request))
        return json_answer(TrafficPlanBody.model_validate(await self.rollout.set_traffic(plan, actor)))

    async def drain(self, request: Request, actor: str) -> Response:
        name, version = _name(request), _version(request)
        status = await self.rollout.drain(name, version, actor, force=await self._force(request))
        return json_answer(status_body(status))

    async def retire(self, request: Request, actor: str) -> Response:
        name, version = _name(request), _version(request)
        status = await self.rollout.retire(name, version, actor, force=await self._force(request))
        headers = {}
        if status.retire is not None:
            headers["x-weir-memory-released-bytes"] = str(status.retire.released_budget_bytes)
            if status.retire.freed_bytes is not None:
                headers["x-weir-memory-freed-bytes"] = str(status.retire.freed_bytes)
        return json_answer(status_body(status), headers=headers)

    async def rollback(self, request: Request, actor: str) -> Response:
        to = parse_rollback(await self.body(request))
        return json_answer(
            TrafficPlanBody.model_validate(await self.rollout.rollback(_name(request), to, actor))
        )


def models_admin_routes(rollout: ModelRollout, admin_auth: AdminAuthenticator) -> list[BaseRoute]:
    """The `/admin/v1/models` routes; place them before the `/admin/v1` catch-all."""
    return ModelsAdminRoutes(rollout, admin_auth).routes()
