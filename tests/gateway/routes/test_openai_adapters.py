"""`model` naming a LoRA adapter: resolution to its base version, the 404 rule, /v1/models, usage."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.engine.request import Priority
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.http.errors import AuthenticationError
from weir.tenancy.catalog.adapter_records import AdapterView
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.store.enums import AdapterState

BASE_VERSION = f"{MODEL}@default"
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def view(name: str, owner: str | None, model_version: str = BASE_VERSION) -> AdapterView:
    return AdapterView(
        name=name,
        model_version=model_version,
        path=name,
        owner_tenant=owner,
        state=AdapterState.LOADED,
        failure_reason=None,
        created_at=NOW,
        updated_at=NOW,
        updated_by="admin",
    )


def context(name: str, quota: QuotaLimits | None = None) -> TenantContext:
    return TenantContext(name, f"key-{name}", Priority.STANDARD, 1.0, f"{name}-scope", quota or QuotaLimits())


TENANTS = {
    "Bearer acme": context("acme"),
    "Bearer globex": context("globex"),
    "Bearer narrow": context("narrow", QuotaLimits(models=(MODEL,))),
}
ACME = {"authorization": "Bearer acme"}
GLOBEX = {"authorization": "Bearer globex"}


class Served:
    def __init__(self, engine: FakeEngine, client: httpx.Client, records: list[UsageRecord]) -> None:
        self.engine, self.client, self.records = engine, client, records


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = FakeEngine()
    catalog = AdapterCatalog()
    catalog.put(view("acme-private", "acme"))
    catalog.put(view("shared-style", None))
    catalog.put(view("lost-base", "acme", model_version="other-model@v1"))  # base not served here
    records: list[UsageRecord] = []

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        if authorization not in TENANTS:
            raise AuthenticationError("bad key")
        return TENANTS[authorization]

    app = make_app(engine, authenticate=authenticate, adapters=catalog, usage_sink=records.append)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        yield Served(engine, client, records)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def test_an_adapter_routes_to_its_base_version_with_adapter_name(served: Served) -> None:
    served.engine.reset()
    r = served.client.post("/v1/chat/completions", json=chat("acme-private"), headers=ACME)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "acme-private"
    assert r.headers["x-weir-model-version"] == "default"
    (request,) = served.engine.requests
    assert request.adapter_name == "acme-private"
    assert request.tenant_id == "acme"


def test_the_base_model_runs_without_an_adapter(served: Served) -> None:
    served.engine.reset()
    r = served.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=ACME
    )
    assert r.status_code == 200, r.text
    assert served.engine.requests[0].adapter_name is None


def test_public_adapter_serves_every_tenant(served: Served) -> None:
    served.engine.reset()
    for headers in (ACME, GLOBEX):
        r = served.client.post(
            "/v1/completions", json={"model": "shared-style", "prompt": "hi"}, headers=headers
        )
        assert r.status_code == 200, r.text
    assert [q.adapter_name for q in served.engine.requests] == ["shared-style", "shared-style"]


def test_another_tenants_private_adapter_is_the_same_404_as_an_unknown_model(served: Served) -> None:
    served.engine.reset()
    private = served.client.post("/v1/chat/completions", json=chat("acme-private"), headers=GLOBEX)
    unknown = served.client.post("/v1/chat/completions", json=chat("no-such-adapter"), headers=GLOBEX)
    assert private.status_code == unknown.status_code == 404
    strip = lambda body: {**body["error"], "message": body["error"]["message"].replace("acme-private", "X")}  # noqa: E731
    assert strip(private.json()) == {
        **unknown.json()["error"],
        "message": unknown.json()["error"]["message"].replace("no-such-adapter", "X"),
    }
    assert private.json()["error"]["code"] == "model_not_found"
    assert served.client.get("/v1/models/acme-private", headers=GLOBEX).status_code == 404
    assert served.engine.num_generate_calls == 0


def test_models_lists_the_adapters_each_tenant_may_call(served: Served) -> None:
    acme = {m["id"]: m for m in served.client.get("/v1/models", headers=ACME).json()["data"]}
    globex = {m["id"] for m in served.client.get("/v1/models", headers=GLOBEX).json()["data"]}
    assert set(acme) == {MODEL, "acme-private", "shared-style"}  # lost-base: its base is not ready
    assert acme["acme-private"]["parent"] == MODEL
    assert globex == {MODEL, "shared-style"}
    card = served.client.get("/v1/models/acme-private", headers=ACME)
    assert card.status_code == 200 and card.json()["id"] == "acme-private"


def test_an_adapter_whose_base_is_not_ready_is_unavailable(served: Served) -> None:
    r = served.client.post("/v1/chat/completions", json=chat("lost-base"), headers=ACME)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "model_version_unavailable"


def test_a_key_limited_to_other_models_may_not_call_an_adapter(served: Served) -> None:
    r = served.client.post(
        "/v1/chat/completions", json=chat("shared-style"), headers={"authorization": "Bearer narrow"}
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    models = served.client.get("/v1/models", headers={"authorization": "Bearer narrow"}).json()["data"]
    assert [m["id"] for m in models] == [MODEL]


def test_usage_records_carry_the_adapter(served: Served) -> None:
    served.records.clear()
    served.client.post("/v1/chat/completions", json=chat("acme-private"), headers=ACME)
    served.client.post("/v1/chat/completions", json=chat(MODEL), headers=ACME)
    # The usage record is settled after the answer went out: wait for both, as the billing tests do.
    assert wait_until(lambda: len(served.records) == 2)
    assert [(r.model, r.adapter, r.model_version) for r in served.records] == [
        ("acme-private", "acme-private", BASE_VERSION),
        (MODEL, None, BASE_VERSION),
    ]


def test_catalog_resolution() -> None:
    catalog = AdapterCatalog()
    catalog.put(view("mine", "acme"))
    catalog.put(view("public", None))
    assert catalog.resolve("mine", "acme") is not None
    assert catalog.resolve("mine", "globex") is None
    assert catalog.resolve("nope", "acme") is None
    assert [v.name for v in catalog.visible_to("globex")] == ["public"]
    catalog.remove("mine")
    assert catalog.resolve("mine", "acme") is None
