"""`/v1/responses` under the same tenancy as the chat route, through a real server (uvicorn on
127.0.0.1, the fake engine, the admission controller on a stopped clock): priorities, per-key
models, output quotas, request budgets with their `x-ratelimit-*` headers, the usage record naming
its endpoint; and, with the whole tenancy on SQLite, the storage quota answered 400 naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.tenancy_server import ADMIN, TENANT, serve_everything
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.engine.request import Priority
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController
from weir.gateway.api.protocol import Endpoint
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext

TENANTS = {
    "batch": (Priority.BATCH, QuotaLimits(tokens_per_minute=100_000, requests_per_minute=100)),
    "other-models": (Priority.STANDARD, QuotaLimits(models=("another-model",))),
    "short": (Priority.STANDARD, QuotaLimits(max_output_tokens=4)),
    "two": (Priority.STANDARD, QuotaLimits(requests_per_minute=2)),
}


@dataclass
class Served:
    engine: FakeEngine
    url: str
    records: list[UsageRecord] = field(default_factory=list)

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=tenant, max_retries=0)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = FakeEngine()
    controller = AdmissionController(engine.stats, LocalBudget(lambda: 1_900_000_000.0), AdmissionConfig())
    records: list[UsageRecord] = []

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        name = (authorization or "").removeprefix("Bearer ")
        priority, quota = TENANTS[name]
        return TenantContext(name, f"key-{name}", priority, 1.0, name, quota)

    app = make_app(engine, authenticate=authenticate, admission=controller, usage_sink=records.append)
    with serve_in_thread(app) as url:
        yield Served(engine, url, records)


def test_priority_usage_record_and_rate_headers(served: Served) -> None:
    with served.client("batch") as c:
        raw = c.responses.with_raw_response.create(model=MODEL, input="hello", max_output_tokens=3)
    response = raw.parse()
    assert response.usage is not None and response.usage.output_tokens == 3
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100_000
    request = served.engine.requests[-1]
    assert (
        request.tenant_id == "batch" and request.priority is Priority.BATCH and request.cache_scope == "batch"
    )
    # The record is written when the request settles, just after its last byte.
    assert wait_until(lambda: any(r.request_id == response.id for r in served.records))
    record = next(r for r in served.records if r.request_id == response.id)
    assert record.endpoint is Endpoint.RESPONSES and record.key_id == "key-batch"
    assert record.usage.completion_tokens == 3
    # A client may lower its priority, never raise it.
    with served.client("batch") as c, pytest.raises(openai.PermissionDeniedError) as raised:
        c.responses.create(
            model=MODEL, input="hello", max_output_tokens=3, extra_body={"priority": "interactive"}
        )
    assert raised.value.body["param"] == "priority"  # type: ignore[index]


def test_per_key_models_and_output_quotas(served: Served) -> None:
    with served.client("other-models") as c, pytest.raises(openai.PermissionDeniedError) as denied:
        c.responses.create(model=MODEL, input="hello", max_output_tokens=3)
    assert denied.value.body["param"] == "model"  # type: ignore[index]
    with served.client("short") as c, pytest.raises(openai.BadRequestError) as short:
        c.responses.create(model=MODEL, input="hello", max_output_tokens=5)
    assert short.value.body["param"] == "max_output_tokens"  # type: ignore[index]


def test_request_budget_refuses_and_spares_other_tenants(served: Served) -> None:
    with served.client("two") as c:
        first = c.responses.create(model=MODEL, input="hello", max_output_tokens=2)
        c.responses.retrieve(first.id)  # reading a stored response is not a generation request
        c.responses.create(model=MODEL, input="hello", max_output_tokens=2)
        with pytest.raises(openai.RateLimitError) as limited:
            c.responses.create(model=MODEL, input="hello", max_output_tokens=2)
        assert limited.value.response.headers.get("retry-after")
    with served.client("batch") as c:
        assert c.responses.create(model=MODEL, input="hello", max_output_tokens=2).status


def test_storage_quota_in_the_database(tmp_path: Path) -> None:
    with serve_everything(tmp_path, response_storage_bytes=3000) as full:
        client = openai.OpenAI(base_url=full.url + "/v1", api_key=full.tenant_key, max_retries=0)
        kept = []
        with pytest.raises(openai.BadRequestError) as refused:
            for _ in range(50):
                kept.append(client.responses.create(model=MODEL, input="hello " * 30, max_output_tokens=2).id)
        body = refused.value.body
        assert body["param"] == "store" and body["code"] == "storage_quota_exceeded"  # type: ignore[index]
        assert kept and client.responses.retrieve(kept[0]).id == kept[0]
        assert client.responses.create(model=MODEL, input="hello", max_output_tokens=2, store=False).id
        # A second tenant has its own quota.
        with httpx.Client(base_url=full.url, headers=ADMIN, timeout=30) as admin:
            assert admin.post("/admin/v1/tenants", json={"name": "second"}).status_code == 201
            key = admin.post("/admin/v1/tenants/second/keys", json={}).json()["key"]
        other = openai.OpenAI(base_url=full.url + "/v1", api_key=key, max_retries=0)
        assert other.responses.create(model=MODEL, input="hello", max_output_tokens=2).id
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(kept[0])


def test_the_admin_sees_a_tenants_stored_responses(tmp_path: Path) -> None:
    with serve_everything(tmp_path, response_storage_bytes=50_000, response_retention_s=3600) as full:
        client = openai.OpenAI(base_url=full.url + "/v1", api_key=full.tenant_key, max_retries=0)
        path = f"/admin/v1/tenants/{TENANT}/stored-responses"
        with httpx.Client(base_url=full.url, headers=ADMIN, timeout=30) as admin:
            before = admin.get(path).json()
            assert before == {"tenant": TENANT, "bytes_used": 0, "quota_bytes": 50_000, "retention_s": 3600.0}
            r = client.responses.create(model=MODEL, input="hello", max_output_tokens=2)
            # Written in the background after the answer: the admin view counts it once committed.
            assert wait_until(lambda: admin.get(path).json()["bytes_used"] > 0)
            client.responses.delete(r.id)
            assert admin.get(path).json()["bytes_used"] == 0
            assert admin.get("/admin/v1/tenants/nobody/stored-responses").status_code == 404
            assert httpx.get(full.url + path, headers=full.tenant).status_code == 401


def test_an_admin_sets_a_tenants_own_storage_quota_and_retention(tmp_path: Path) -> None:
    with serve_everything(tmp_path, response_storage_bytes=50_000, response_retention_s=3600) as full:
        client = openai.OpenAI(base_url=full.url + "/v1", api_key=full.tenant_key, max_retries=0)
        path = f"/admin/v1/tenants/{TENANT}/stored-responses"
        with httpx.Client(base_url=full.url, headers=ADMIN, timeout=30) as admin:
            quota = {"response_storage_bytes": 0, "response_retention_s": 60}
            put = admin.put(f"/admin/v1/tenants/{TENANT}/quota", json=quota)
            assert put.status_code == 200, put.text
            assert put.json()["quota"]["response_storage_bytes"] == 0
            view = admin.get(path).json()
            assert (view["quota_bytes"], view["retention_s"]) == (0, 60.0)
            assert wait_until(lambda: _refused_storing(client))  # the key cache may hold the old quota
            assert client.responses.create(model=MODEL, input="hello", max_output_tokens=2, store=False).id
            # Back to the server's defaults: null is "not set".
            put = admin.put(f"/admin/v1/tenants/{TENANT}/quota", json={})
            view = admin.get(path).json()
            assert (view["quota_bytes"], view["retention_s"]) == (50_000, 3600.0)


def _refused_storing(client: openai.OpenAI) -> bool:
    try:
        client.responses.create(model=MODEL, input="hello", max_output_tokens=2)
    except openai.BadRequestError as refused:
        return refused.body["code"] == "storage_quota_exceeded"  # type: ignore[index, no-any-return]
    return False
