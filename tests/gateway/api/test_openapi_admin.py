"""gateway/api/openapi_admin.py: a real answer of every admin operation validates against the
generated /openapi.json, and so does every request body sent to get it, so the document and the
routes cannot drift apart (both come from the body models, this keeps it so)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from tests.gateway.fake_engine import FakePrefixCache
from tests.gateway.fleet.test_model_fleet import MIB, Factory
from tests.gateway.harness import make_app, tokenizer
from tests.tenancy.clock import START, FakeClock
from weir.engine.kv.memory_budget import MemoryBudget
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.routes.admin import admin_routes
from weir.gateway.routes.models_admin import models_admin_routes
from weir.gateway.routes.prefix_cache import prefix_cache_routes
from weir.gateway.routes.spend_admin import spend_admin_routes
from weir.migrations.migrate import upgrade
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.admin_token import ensure_admin_token
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn


@dataclass
class Checked:
    """A client that validates every admin exchange against the app's own /openapi.json."""

    client: TestClient
    admin: dict[str, str]
    repo: TenancyRepo
    doc: dict[str, Any] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {**schema, "components": self.doc["components"]}

    def call(
        self,
        method: str,
        template: str,
        status: int = 200,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        **path: str,
    ) -> Any:
        """Call the operation `template` (its path parameters in `path`); check the request body,
        the status and the answer against the document; the answer's JSON."""
        op = self.doc["paths"][template][method]
        if json is not None:
            request_schema = op["requestBody"]["content"]["application/json"]["schema"]
            jsonschema.validate(json, self.schema(request_schema))
        url = template.format(**path)
        response = self.client.request(
            method.upper(), url, json=json, params=params, headers=headers or self.admin
        )
        assert response.status_code == status, response.text
        answer = response.json()
        documented = op["responses"][str(status)]["content"]["application/json"]["schema"]
        jsonschema.validate(answer, self.schema(documented))
        self.seen.add((template, method))
        return answer


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Checked]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"pepper"), clock=FakeClock())
    token = ensure_admin_token(repo, None)
    assert token is not None
    authenticator = Authenticator(repo, AuthSettings(max_failures=10_000))
    admin_auth = AdminAuthenticator(repo, None, throttle=authenticator.throttle)
    fleet = ModelFleet(Factory(), MemoryBudget(8 * MIB))
    rollout = ModelRollout(fleet, ModelVersionRepo(db))
    routes = [
        *prefix_cache_routes(FakePrefixCache(), admin_auth, tokenizer()),
        *models_admin_routes(rollout, admin_auth),
        *spend_admin_routes(db, admin_auth),  # before the /admin/v1 mount, as bootstrap puts them
        *admin_routes(repo, authenticator, admin_auth),
    ]
    app = make_app(None, fleet=fleet, extra_routes=routes)  # type: ignore[arg-type]
    with TestClient(app) as client:
        checked = Checked(client, {"Authorization": f"Bearer {token}"}, repo)
        checked.doc = client.get("/openapi.json").json()
        yield checked
    db.dispose()


def _admin_operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (path, method)
        for path, item in doc["paths"].items()
        if path.startswith("/admin/") or path == "/v1/usage"
        for method in item
    }


def _tenancy(api: Checked) -> None:
    body = {"name": "acme", "priority": "interactive", "weight": 2,
            "quota": {"tokens_per_minute": 20000, "max_concurrent": 8, "models": ["m"], "ttft_slo_ms": 2000}}  # fmt: skip
    api.call("post", "/admin/v1/tenants", 201, json=body)
    api.call("post", "/admin/v1/tenants", 201, json={"name": "beta", "share_cache_scope_with": "acme"})
    api.call("get", "/admin/v1/tenants")
    api.call("get", "/admin/v1/tenants/{name}", name="acme")
    api.call("patch", "/admin/v1/tenants/{name}", json={"weight": 3.5, "priority": "batch"}, name="acme")
    api.call(
        "put", "/admin/v1/tenants/{name}/quota", json={"max_output_tokens": 64, "models": None}, name="acme"
    )
    key = api.call("post", "/admin/v1/tenants/{name}/keys", 201,
                   json={"scopes": ["inference", "usage"], "expires_at": "2099-01-01T00:00:00Z"}, name="acme")  # fmt: skip
    api.call("post", "/admin/v1/tenants/{name}/keys", 201, json={}, name="acme")
    api.call("get", "/admin/v1/tenants/{name}/keys", name="acme")
    api.call("get", "/admin/v1/keys/{key_id}", key_id=key["id"])
    api.call("put", "/admin/v1/keys/{key_id}/limits", json={"requests_per_minute": 5}, key_id=key["id"])
    rotated = api.call("post", "/admin/v1/keys/{key_id}/rotate", 201, key_id=key["id"])
    record = UsageRecordIn("r1", "acme", rotated["id"], "m", UsageStatus.COMPLETED, 10, 3, cached_tokens=2,
                           ttft_ms=5.0, e2e_ms=9.0, created_at=START, model_version="m@v1", user="u")  # fmt: skip
    api.repo.record_usage(record)
    since = {"since": START.date().isoformat()}
    usage = api.call("get", "/admin/v1/tenants/{name}/usage", params=since, name="acme")
    stored = api.call("get", "/admin/v1/tenants/{name}/stored-responses", name="acme")
    assert stored["tenant"] == "acme" and stored["bytes_used"] == 0
    assert usage["total"]["total_tokens"] == 13
    own = api.call("get", "/v1/usage", params=since, headers={"Authorization": f"Bearer {rotated['key']}"})
    assert own["total"] == usage["total"]
    report = {
        "since": START.date().isoformat(),
        "until": "2099-01-01",
        "group_by": "tenant,key,model,day,hour",
    }
    assert api.call("get", "/admin/v1/usage/report", params=report)["totals"]["requests"] == 1
    api.call("get", "/admin/v1/audit", params={"tenant": "acme", "limit": "50"})
    api.call("delete", "/admin/v1/keys/{key_id}", key_id=rotated["id"])
    api.call("post", "/admin/v1/tenants/{name}/suspend", name="beta")
    # An error answer is documented too.
    api.call("post", "/admin/v1/tenants", 422, json={"name": "gamma", "weight": 0})


def _models(api: Checked) -> None:
    base = "/admin/v1/models"
    version = base + "/{name}/versions/{version}"
    for v in ("v1", "v2", "v3"):
        api.call("post", base, 201, json={"name": "m", "version": v, "path": "ok", "kv_cache_tokens": 16})
        api.call("post", version + "/load", name="m", version=v)
    api.call("put", base + "/{name}/traffic", json={"split": {"v2": 100}, "pins": {"acme": "v1"}}, name="m")
    assert api.call("get", base)["traffic"]["m"]["split"] == {"v2": 100}
    api.call("post", version + "/drain", name="m", version="v3")
    api.call("post", base + "/{name}/rollback", json={"to": "v1"}, name="m")  # v2 drains
    api.call("post", version + "/retire", name="m", version="v2")


def _prefix_cache(api: Checked) -> None:
    base = "/admin/v1/prefix-cache"
    api.call("get", base + "/stats")
    api.call("get", base + "/tenants/{name}", name="acme")
    made = api.call(
        "post", base + "/prefixes", 201, json={"text": "You are a helpful assistant.", "name": "sys"}
    )
    api.call("get", base + "/prefixes")
    api.call("get", base + "/prefixes/{prefix_id}", prefix_id=made["id"])
    api.call("post", base + "/prefixes/{prefix_id}/pin", prefix_id=made["id"])
    api.call("post", base + "/prefixes/{prefix_id}/unpin", prefix_id=made["id"])
    api.call("post", base + "/flush", json={"tenant": "acme", "include_pinned": True})
    api.call("delete", base + "/prefixes/{prefix_id}", prefix_id=made["id"])


def _spend(api: Checked) -> None:
    price = {"model": "m@v1", "input_per_million": "0.15", "output_per_million": "0.60"}
    api.call("post", "/admin/v1/prices", 201, json=price)
    assert api.call("get", "/admin/v1/prices", params={"model": "m@v1"})["data"][0]["model"] == "m@v1"
    budget = {
        "tenant": "acme",
        "unit": "tokens",
        "window": "day",
        "time_zone": "Europe/Paris",
        "hard_limit": 1000,
    }
    made = api.call("put", "/admin/v1/budgets", json=budget)
    assert api.call("get", "/admin/v1/budgets", params={"tenant": "acme"})["data"][0]["id"] == made["id"]
    api.call("delete", "/admin/v1/budgets/{budget_id}", budget_id=str(made["id"]))


def test_every_admin_answer_validates_against_the_generated_schema(api: Checked) -> None:
    _tenancy(api)
    _models(api)
    _prefix_cache(api)
    _spend(api)
    assert api.seen == _admin_operations(api.doc)


def test_the_admin_schemas_are_generated_not_hand_made(api: Checked) -> None:
    schemas = api.doc["components"]["schemas"]

    def request_body(path: str) -> dict[str, Any]:
        ref = api.doc["paths"][path]["put"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return dict(schemas[ref.rsplit("/", 1)[1]])

    quota = request_body("/admin/v1/tenants/{name}/quota")
    assert quota["additionalProperties"] is False
    assert set(quota["properties"]) == {
        "tokens_per_minute", "requests_per_minute", "tokens_per_day", "max_concurrent", "max_prompt_tokens",
        "max_output_tokens", "models", "ttft_slo_ms", "tpot_slo_ms", "default_max_tokens_reservation",
        "response_storage_bytes", "response_retention_s",
    }  # fmt: skip
    # A key may set only its own limits: no SLOs, no reservation.
    assert "ttft_slo_ms" not in request_body("/admin/v1/keys/{key_id}/limits")["properties"]
    # Every admin answer is a documented object, never a bare `{"type": "object"}`.
    for path, item in _admin_paths(api.doc):
        for method, op in item.items():
            ok = next(code for code in op["responses"] if code.startswith("2"))
            schema = op["responses"][ok]["content"]["application/json"]["schema"]
            assert re.fullmatch(r"#/components/schemas/[\w-]+", schema.get("$ref", "")), (path, method)


def _admin_paths(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p, item) for p, item in doc["paths"].items() if p.startswith("/admin/") or p == "/v1/usage"]
