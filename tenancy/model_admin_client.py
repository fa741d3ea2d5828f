"""The model-version operations behind `weir admin models ...`, against the database or a server.

Both backends return the admin API's JSON objects (`tenancy.model_codec`), so the CLI prints
the same thing either way. Over HTTP the running server acts at once: it loads, warms up, moves
traffic, drains and frees memory. Directly on the database only the records change; a server
picks them up at its next start (a reload reads versions, states, split and pins), and `load`
can only mark the intent: the version becomes `loading`, and the server that starts next loads
it (weights need a server process).
"""

from __future__ import annotations

from typing import Protocol

from tenancy.admin_client import CLI_ACTOR, HttpAdmin, path_segment
from tenancy.admin_codec import JsonObject
from tenancy.model_codec import (
    models_json,
    parse_models_json,
    parse_traffic_json,
    parse_version_json,
    rollback_json,
    spec_json,
    traffic_body_json,
    traffic_json,
    version_json,
)
from tenancy.model_version_records import ModelVersionSpec, ModelVersionState, TrafficPlan
from tenancy.model_versions import ModelVersionRepo

# A load reads the weights and runs a warm-up generation before it answers.
LOAD_TIMEOUT_S = 900.0


class ModelAdminBackend(Protocol):
    """The model-version operations; each returns the admin API's JSON object for the result."""

    def list_models(self, name: str | None) -> JsonObject: ...
    def register(self, spec: ModelVersionSpec) -> JsonObject: ...
    def load(self, name: str, version: str) -> JsonObject: ...
    def set_traffic(self, plan: TrafficPlan) -> JsonObject: ...
    def drain(self, name: str, version: str) -> JsonObject: ...
    def retire(self, name: str, version: str) -> JsonObject: ...
    def rollback(self, name: str, to: str) -> JsonObject: ...


class DirectModelAdmin:
    """Model versions straight on the database: records only, for the next server start."""

    def __init__(self, repo: ModelVersionRepo, actor: str = CLI_ACTOR) -> None:
        self.repo = repo
        self.actor = actor

    def _version(self, name: str, version: str) -> JsonObject:
        view = self.repo.get(name, version)
        return version_json(view, self.repo.list_traffic().get(name))

    def list_models(self, name: str | None) -> JsonObject:
        plans = self.repo.list_traffic()
        if name is not None:
            plans = {n: p for n, p in plans.items() if n == name}
        return models_json(self.repo.list(name), plans)

    def register(self, spec: ModelVersionSpec) -> JsonObject:
        return version_json(self.repo.register(spec, actor=self.actor))

    def load(self, name: str, version: str) -> JsonObject:
        # Only the intent: the next server start loads (and warms up) a `loading` version.
        self.repo.set_state(name, version, ModelVersionState.LOADING, actor=self.actor)
        return self._version(name, version)

    def set_traffic(self, plan: TrafficPlan) -> JsonObject:
        return traffic_json(self.repo.set_traffic(plan, actor=self.actor))

    def drain(self, name: str, version: str) -> JsonObject:
        self.repo.set_state(name, version, ModelVersionState.DRAINING, actor=self.actor)
        return self._version(name, version)

    def retire(self, name: str, version: str) -> JsonObject:
        self.repo.set_state(name, version, ModelVersionState.RETIRED, actor=self.actor)
        return self._version(name, version)

    def rollback(self, name: str, to: str) -> JsonObject:
        plan, _drained = self.repo.rollback(name, to, actor=self.actor)
        return traffic_json(plan)


class HttpModelAdmin:
    """Model versions through a running server's `/admin/v1/models` routes.

    Answers are checked against the codec (`parse_*`) before they are printed, so a server
    speaking another shape is reported, not echoed.
    """

    def __init__(self, server: HttpAdmin) -> None:
        self.server = server

    def _version_path(self, name: str, version: str, action: str) -> str:
        return f"/models/{path_segment(name)}/versions/{path_segment(version)}/{action}"

    def _version(self, answer: JsonObject) -> JsonObject:
        parse_version_json(answer)
        return answer

    def _plan(self, answer: JsonObject) -> JsonObject:
        parse_traffic_json(answer)
        return answer

    def list_models(self, name: str | None) -> JsonObject:
        answer = self.server.call("GET", "/models")
        listings, plans = parse_models_json(answer)
        if name is None:
            return answer
        return {
            "data": [
                item
                for item, parsed in zip(answer["data"], listings, strict=True)
                if parsed.view.name == name
            ],
            "traffic": {n: traffic_body_json(p) for n, p in plans.items() if n == name},
        }

    def register(self, spec: ModelVersionSpec) -> JsonObject:
        return self._version(self.server.call("POST", "/models", json=spec_json(spec)))

    def load(self, name: str, version: str) -> JsonObject:
        path = self._version_path(name, version, "load")
        return self._version(self.server.call("POST", path, timeout_s=LOAD_TIMEOUT_S))

    def set_traffic(self, plan: TrafficPlan) -> JsonObject:
        path = f"/models/{path_segment(plan.name)}/traffic"
        return self._plan(self.server.call("PUT", path, json=traffic_body_json(plan)))

    def drain(self, name: str, version: str) -> JsonObject:
        return self._version(self.server.call("POST", self._version_path(name, version, "drain")))

    def retire(self, name: str, version: str) -> JsonObject:
        return self._version(self.server.call("POST", self._version_path(name, version, "retire")))

    def rollback(self, name: str, to: str) -> JsonObject:
        path = f"/models/{path_segment(name)}/rollback"
        return self._plan(self.server.call("POST", path, json=rollback_json(to)))
