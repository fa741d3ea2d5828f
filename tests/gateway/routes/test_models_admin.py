"""The model-version admin routes over a real repository (SQLite) and a fleet of fake engines:
auth, the codec's shapes, body and state errors, failed loads, traffic, drain/retire, rollback,
and the OpenAI routes following the plan with the version header."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.gateway.fleet.test_model_fleet import MIB, Factory
from tests.gateway.harness import make_app
from tests.gateway.routes.test_prefix_cache import ADMIN, TOKEN, _Store
from weir.engine.kv.memory_budget import MemoryBudget
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.failure_throttle import FailureThrottle
from weir.gateway.routes.models_admin import models_admin_routes
from weir.migrations.migrate import upgrade
from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionList,
    ModelVersionListing,
    TrafficPlanBody,
)
from weir.tenancy.catalog.model_version_records import TrafficPlan
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database


# The answers read through the body models (the codec's parse functions before them).
def parse_version_json(obj: object) -> ModelVersionListing:
    return ModelVersion.model_validate(obj).listing()


def parse_traffic_json(obj: object) -> TrafficPlan:
    body = TrafficPlanBody.model_validate(obj)
    return body.plan(body.name)


def parse_models_json(obj: object) -> tuple[list[ModelVersionListing], dict[str, TrafficPlan]]:
    return ModelVersionList.model_validate(obj).parsed()


BASE = "/admin/v1/models"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    TenancyRepo(db, KeyHasher(b"pepper")).create_tenant(TenantSpec("acme"), actor="test")  # pinned below
    fleet = ModelFleet(Factory(), MemoryBudget(8 * MIB))
    rollout = ModelRollout(fleet, ModelVersionRepo(db))
    auth = AdminAuthenticator(
        _Store(), TOKEN, throttle=FailureThrottle.from_settings(AuthSettings(max_failures=10_000))
    )
    app = make_app(None, fleet=fleet, extra_routes=models_admin_routes(rollout, auth))  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield client
    db.dispose()


def _register(client: TestClient, version: str, **extra: object) -> None:
    body = {"name": "m", "version": version, "path": "ok", **extra}
    answer = client.post(BASE, json=body, headers=ADMIN)
    assert answer.status_code == 201, answer.text
    parse_version_json(answer.json())


def test_every_route_needs_the_admin_token(api: TestClient) -> None:
    for method, path in (("GET", BASE), ("POST", BASE), ("POST", f"{BASE}/m/versions/v1/load")):
        assert api.request(method, path).status_code == 401


def test_register_load_traffic_drain_retire_and_rollback(api: TestClient) -> None:
    for v in ("v1", "v2"):
        _register(api, v)
        loaded = api.post(f"{BASE}/m/versions/{v}/load", headers=ADMIN)
        assert loaded.status_code == 200 and parse_version_json(loaded.json()).view.state.value == "ready"
    plan = api.put(f"{BASE}/m/traffic", json={"split": {"v2": 100}, "pins": {"acme": "v1"}}, headers=ADMIN)
    assert plan.status_code == 200 and parse_traffic_json(plan.json()).split == {"v2": 100}
    completion = api.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 2})
    assert completion.status_code == 200 and completion.headers["x-weir-model-version"] == "v2"
    assert completion.json()["model"] == "m"
    listings, plans = parse_models_json(api.get(BASE, headers=ADMIN).json())
    by_version = {item.view.version: item for item in listings}
    assert by_version["v2"].traffic_percent == 100 and by_version["v1"].pinned_tenants == ("acme",)
    assert plans["m"].pins == {"acme": "v1"}
    back = api.post(f"{BASE}/m/rollback", json={"to": "v1"}, headers=ADMIN)
    assert back.status_code == 200 and back.json() == {
        "name": "m",
        "split": {"v1": 100},
        "pins": {"acme": "v1"},
    }
    assert api.get(BASE, headers=ADMIN).json()["data"][1]["state"] == "draining"
    retired = api.post(f"{BASE}/m/versions/v2/retire", headers=ADMIN)
    assert retired.status_code == 200 and retired.json()["state"] == "retired"
    assert int(retired.headers["x-weir-memory-released-bytes"]) > 0
    after = api.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 2})
    assert after.headers["x-weir-model-version"] == "v1"
    # An error after routing names the version too (the context is the routed version's).
    too_long = api.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 100_000})
    assert too_long.status_code == 400 and too_long.headers["x-weir-model-version"] == "v1"
    # ... and one before routing (an unknown model) names none.
    assert (
        "x-weir-model-version" not in api.post("/v1/completions", json={"model": "x", "prompt": "a"}).headers
    )


def test_a_failed_load_is_422_naming_the_reason_and_the_version_is_failed(api: TestClient) -> None:
    _register(api, "v1", kv_cache_tokens=64 * MIB)
    answer = api.post(f"{BASE}/m/versions/v1/load", headers=ADMIN)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "model_load_failed"
    assert "does not fit the memory budget" in answer.json()["error"]["message"]
    listed = api.get(BASE, headers=ADMIN).json()["data"][0]
    assert listed["state"] == "failed" and "needs" in listed["failure_reason"]


def test_errors_name_the_field_or_the_state(api: TestClient) -> None:
    bad = api.post(BASE, json={"name": "m", "version": "v1", "path": "ok", "weights": 1}, headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "weights"
    assert api.post(f"{BASE}/m/versions/v9/load", headers=ADMIN).status_code == 404
    assert api.post(f"{BASE}/no%20such/versions/v1/drain", headers=ADMIN).status_code == 404
    _register(api, "v1")
    not_ready = api.put(f"{BASE}/m/traffic", json={"split": {"v1": 100}}, headers=ADMIN)
    assert not_ready.status_code == 409 and not_ready.json()["error"]["code"] == "model_version_not_ready"
    assert api.post(f"{BASE}/m/versions/v1/retire", headers=ADMIN).status_code == 409
    assert api.post(BASE, json={"name": "m", "version": "v1", "path": "ok"}, headers=ADMIN).status_code == 409
    # A model with no ready version: 404 on the OpenAI routes (the name is not served).
    assert api.post("/v1/completions", json={"model": "m", "prompt": "x"}).status_code == 404


def test_a_pin_to_a_tenant_that_does_not_exist_is_a_404_naming_it(api: TestClient) -> None:
    """Issue 21 item 5: pins to misspelt or unknown tenants were stored and routed nobody."""
    _register(api, "v1")
    assert api.post(f"{BASE}/m/versions/v1/load", headers=ADMIN).status_code == 200
    refused = api.put(
        f"{BASE}/m/traffic", json={"split": {"v1": 100}, "pins": {"acnme": "v1"}}, headers=ADMIN
    )
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["param"] == "pins.acnme" and "'acnme' not found" in error["message"], error
    assert api.get(BASE, headers=ADMIN).json()["traffic"] == {}  # nothing stored
    kept = api.put(f"{BASE}/m/traffic", json={"split": {"v1": 100}, "pins": {"acme": "v1"}}, headers=ADMIN)
    assert kept.status_code == 200 and kept.json()["pins"] == {"acme": "v1"}
