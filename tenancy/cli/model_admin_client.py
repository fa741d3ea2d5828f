"""The model-version operations behind `weir admin models ...`, against the database or a server.

Both backends return the admin API's JSON objects (`weir.tenancy.admin_bodies.model_versions`), so the CLI prints
the same thing either way. Over HTTP the running server acts at once: it loads, warms up, moves
traffic, drains and frees memory. Directly on the database only the records change; a server
picks them up at its next start (a reload reads versions, states, split and pins), and `load`
can only mark the intent: the version becomes `loading`, and the server that starts next loads
it (weights need a server process).
"""

from __future__ import annotations

from typing import Protocol

from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionCreate,
    ModelVersionList,
    Rollback,
    TrafficBody,
    TrafficPlanBody,
    VersionAction,
)
from weir.tenancy.catalog.model_version_records import ModelVersionSpec, TrafficPlan
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.catalog.rollout_guards import check_keeps_serving, check_plan_serves
from weir.tenancy.cli.admin_client import CLI_ACTOR, HttpAdmin, JsonObject, path_segment
from weir.tenancy.parsing import parse_model
from weir.tenancy.store.enums import ModelVersionState

# A load reads the weights and runs a warm-up generation before it answers.
LOAD_TIMEOUT_S = 900.0


class ModelAdminBackend(Protocol):
    """The model-version operations; each returns the admin API's JSON object for the result."""

    def list_models(self, name: str | None) -> JsonObject: ...
    def register(self, spec: ModelVersionSpec) -> JsonObject: ...
    def load(self, name: str, version: str) -> JsonObject: ...
    def set_traffic(self, plan: TrafficPlan) -> JsonObject: ...
    def drain(self, name: str, version: str, force: bool = False) -> JsonObject: ...
    def retire(self, name: str, version: str, force: bool = False) -> JsonObject: ...
    def rollback(self, name: str, to: str) -> JsonObject: ...


class DirectModelAdmin:
    """Model versions straight on the database: records only, for the next server start."""

    def __init__(self, repo: ModelVersionRepo, actor: str = CLI_ACTOR) -> None:
        self.repo = repo
        self.actor = actor

    def _version(self, name: str, version: str) -> JsonObject:
        view = self.repo.get(name, version)
        return ModelVersion.of(view, self.repo.list_traffic().get(name)).model_dump(mode="json")

    def list_models(self, name: str | None) -> JsonObject:
        plans = self.repo.list_traffic()
        if name is not None:
            plans = {n: p for n, p in plans.items() if n == name}
        versions = [ModelVersion.of(v, plans.get(v.name)) for v in self.repo.list(name)]
        return ModelVersionList.of(versions, plans).model_dump(mode="json")

    def register(self, spec: ModelVersionSpec) -> JsonObject:
        return ModelVersion.of(self.repo.register(spec, actor=self.actor)).model_dump(mode="json")

    def load(self, name: str, version: str) -> JsonObject:
        # Only the intent: the next server start loads (and warms up) a `loading` version.
        self.repo.set_state(name, version, ModelVersionState.LOADING, actor=self.actor)
        return self._version(name, version)

    def set_traffic(self, plan: TrafficPlan) -> JsonObject:
        # The server refuses a share or a pin on a version it does not serve; so do the records.
        # (A version the model lacks is the repository's error, which names it as not found.)
        states = {v.version: v.state for v in self.repo.list(plan.name)}
        if plan.versions() <= states.keys():
            check_plan_serves(plan, states)
        return TrafficPlanBody.model_validate(self.repo.set_traffic(plan, actor=self.actor)).model_dump(
            mode="json"
        )

    def _ready(self, name: str) -> list[str]:
        return [v.version for v in self.repo.list(name) if v.state is ModelVersionState.READY]

    def drain(self, name: str, version: str, force: bool = False) -> JsonObject:
        if self.repo.get(name, version).state is ModelVersionState.READY:
            check_keeps_serving(name, version, self._ready(name), "drain", force=force)
        self.repo.set_state(name, version, ModelVersionState.DRAINING, actor=self.actor)
        return self._version(name, version)

    def retire(self, name: str, version: str, force: bool = False) -> JsonObject:
        if self.repo.get(name, version).state is ModelVersionState.DRAINING:
            check_keeps_serving(name, version, self._ready(name), "retire", force=force)
        self.repo.set_state(name, version, ModelVersionState.RETIRED, actor=self.actor)
        return self._version(name, version)

    def rollback(self, name: str, to: str) -> JsonObject:
        plan, _drained = self.repo.rollback(name, to, actor=self.actor)
        return TrafficPlanBody.model_validate(plan).model_dump(mode="json")


class HttpModelAdmin:
    """Model versions through a running server's `/admin/v1/models` routes.

    Answers are checked against the body models before they are printed, so a server
    speaking another shape is reported, not echoed.
    """

    def __init__(self, server: HttpAdmin) -> None:
        self.server = server

    def _version_path(self, name: str, version: str, action: str) -> str:
        return f"/models/{path_segment(name)}/versions/{path_segment(version)}/{action}"

    def _version(self, answer: JsonObject) -> JsonObject:
        parse_model(ModelVersion, answer, "answer").listing()
        return answer

    def _plan(self, answer: JsonObject) -> JsonObject:
        parse_model(TrafficPlanBody, answer, "answer")
        return answer

    def list_models(self, name: str | None) -> JsonObject:
        answer = self.server.call("GET", "/models")
        listings, plans = parse_model(ModelVersionList, answer, "answer").parsed()
        if name is None:
            return answer
        return {
            "data": [
                item
                for item, parsed in zip(answer["data"], listings, strict=True)
                if parsed.view.name == name
            ],
            "traffic": {
                n: TrafficBody.model_validate(p).model_dump(mode="json")
                for n, p in plans.items()
                if n == name
            },
        }

    def register(self, spec: ModelVersionSpec) -> JsonObject:
        return self._version(
            self.server.call(
                "POST",
                "/models",
                json=ModelVersionCreate.model_validate(spec).model_dump(mode="json", exclude_none=True),
            )
        )

    def load(self, name: str, version: str) -> JsonObject:
        path = self._version_path(name, version, "load")
        return self._version(self.server.call("POST", path, timeout_s=LOAD_TIMEOUT_S))

    def set_traffic(self, plan: TrafficPlan) -> JsonObject:
        path = f"/models/{path_segment(plan.name)}/traffic"
        return self._plan(
            self.server.call("PUT", path, json=TrafficBody.model_validate(plan).model_dump(mode="json"))
        )

    def drain(self, name: str, version: str, force: bool = False) -> JsonObject:
        path = self._version_path(name, version, "drain")
        return self._version(self.server.call("POST", path, json=VersionAction(force=force).model_dump()))

    def retire(self, name: str, version: str, force: bool = False) -> JsonObject:
        path = self._version_path(name, version, "retire")
        return self._version(self.server.call("POST", path, json=VersionAction(force=force).model_dump()))

    def rollback(self, name: str, to: str) -> JsonObject:
        path = f"/models/{path_segment(name)}/rollback"
        return self._plan(self.server.call("POST", path, json=Rollback(to=to).model_dump(mode="json")))
