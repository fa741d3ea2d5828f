"""An in-process stand-in for the server's `/admin/v1/models` routes, for the CLI's HTTP path.

It speaks the documented shapes through the shared body models (`weir.tenancy.admin_bodies.model_versions`) over a real
`ModelVersionRepo`, with the real error mapping (`weir.gateway.http.errors`). It has no engines: `load`
moves the record loading -> ready (a path that is not a directory fails the load with its
reason, as a server's would). The real routes live in the gateway and are tested end to end
there; this checks that the client and the models agree on every route, method and shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from weir.gateway.http.errors import exception_handlers
from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionList,
    TrafficPlanBody,
    parse_rollback,
    parse_spec,
    parse_traffic,
    parse_version_action,
)
from weir.tenancy.catalog.model_versions import ModelVersionRepo, ModelVersionState
from weir.tenancy.cli.model_admin_client import DirectModelAdmin
from weir.tenancy.errors import FieldError

ACTOR = "admin-api test"


def model_admin_app(repo: ModelVersionRepo) -> Starlette:
    """A Starlette app serving the model-version admin routes over `repo`."""

    async def body(request: Request) -> object:
        raw = await request.body()
        if not raw:
            return None
        try:
            return await request.json()
        except ValueError:
            raise FieldError("body", "must be JSON") from None

    def version(name: str, label: str) -> JSONResponse:
        body = ModelVersion.of(repo.get(name, label), repo.list_traffic().get(name))
        return JSONResponse(body.model_dump(mode="json"))

    async def list_models(request: Request) -> JSONResponse:
        plans = repo.list_traffic()
        versions = [ModelVersion.of(v, plans.get(v.name)) for v in repo.list()]
        return JSONResponse(ModelVersionList.of(versions, plans).model_dump(mode="json"))

    async def register(request: Request) -> JSONResponse:
        view = repo.register(parse_spec(await body(request)), actor=ACTOR)
        return JSONResponse(ModelVersion.of(view).model_dump(mode="json"), status_code=201)

    async def load(request: Request) -> JSONResponse:
        name, label = request.path_params["name"], request.path_params["version"]
        view = repo.set_state(name, label, ModelVersionState.LOADING, actor=ACTOR)
        if not Path(view.path).is_dir():
            reason = f"weights path {view.path} is not a directory"
            repo.set_state(name, label, ModelVersionState.FAILED, reason=reason, actor=ACTOR)
            raise FieldError("path", f"load failed: {reason}")
        repo.set_state(name, label, ModelVersionState.READY, actor=ACTOR)
        return version(name, label)

    # The rollout guards (last ready version, plans on ready versions) as the records apply them.
    direct = DirectModelAdmin(repo, ACTOR)

    def move(state: ModelVersionState) -> Callable[[Request], Awaitable[JSONResponse]]:
        act = direct.drain if state is ModelVersionState.DRAINING else direct.retire

        async def handler(request: Request) -> JSONResponse:
            name, label = request.path_params["name"], request.path_params["version"]
            act(
                name,
                label,
                parse_version_action(await body(request) or {}, request.query_params.get("force")),
            )
            return version(name, label)

        return handler

    async def traffic(request: Request) -> JSONResponse:
        plan = parse_traffic(request.path_params["name"], await body(request))
        return JSONResponse(direct.set_traffic(plan))

    async def rollback(request: Request) -> JSONResponse:
        plan, _ = repo.rollback(request.path_params["name"], parse_rollback(await body(request)), actor=ACTOR)
        return JSONResponse(TrafficPlanBody.model_validate(plan).model_dump(mode="json"))

    base = "/admin/v1/models"
    return Starlette(
        routes=[
            Route(base, list_models, methods=["GET"]),
            Route(base, register, methods=["POST"]),
            Route(base + "/{name}/versions/{version}/load", load, methods=["POST"]),
            Route(
                base + "/{name}/versions/{version}/drain", move(ModelVersionState.DRAINING), methods=["POST"]
            ),
            Route(
                base + "/{name}/versions/{version}/retire", move(ModelVersionState.RETIRED), methods=["POST"]
            ),
            Route(base + "/{name}/traffic", traffic, methods=["PUT"]),
            Route(base + "/{name}/rollback", rollback, methods=["POST"]),
        ],
        exception_handlers=exception_handlers(),
    )
