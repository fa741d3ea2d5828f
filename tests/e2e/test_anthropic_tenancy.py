"""`/v1/messages` and `/tokenize` under the same tenancy as the chat route, through a real server
(uvicorn on 127.0.0.1, the fake engine, the admission controller on a stopped clock).

Keys sent as `x-api-key`, priorities, per-key models, output quotas, request budgets with their
`x-ratelimit-*` headers and the usage record naming its endpoint. Nothing depends on timing: the
budget's clock moves only when a test moves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import anthropic
import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread
from weir.engine.request import Priority
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController
from weir.gateway.api.protocol import Endpoint
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext

ASK = [{"role": "user", "content": "hello"}]
TENANTS = {
    "batch": (Priority.BATCH, QuotaLimits(tokens_per_minute=100_000, requests_per_minute=100)),
    "other-models": (Priority.STANDARD, QuotaLimits(models=("another-model",))),
    "short": (Priority.STANDARD, QuotaLimits(max_output_tokens=4)),
    "three": (Priority.STANDARD, QuotaLimits(requests_per_minute=3)),
}


@dataclass
class Served:
    engine: FakeEngine
    url: str
    records: list[UsageRecord] = field(default_factory=list)

    def client(self, tenant: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=tenant, max_retries=0)


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


def test_x_api_key_priority_usage_record_and_rate_headers(served: Served) -> None:
    with served.client("batch") as c:
        raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=3, messages=ASK)  # type: ignore[arg-type]
    message = raw.parse()
    assert message.usage.output_tokens == 3 and message.stop_reason == "max_tokens"
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100_000
    request = served.engine.requests[-1]
    assert request.tenant_id == "batch" and request.priority is Priority.BATCH
    record = next(r for r in served.records if r.request_id == message.id)
    assert record.endpoint is Endpoint.MESSAGES and record.key_id == "key-batch"
    assert record.usage.completion_tokens == 3


def test_per_key_models_and_quotas_answer_in_anthropics_shape(served: Served) -> None:
    with served.client("other-models") as c, pytest.raises(anthropic.PermissionDeniedError) as denied:
        c.messages.create(model=MODEL, max_tokens=3, messages=ASK)  # type: ignore[arg-type]
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    with served.client("short") as c, pytest.raises(anthropic.BadRequestError) as short:
        c.messages.create(model=MODEL, max_tokens=5, messages=ASK)  # type: ignore[arg-type]
    assert short.value.body["error"]["param"] == "max_tokens"  # type: ignore[index]


def test_tokenize_counts_against_the_request_budget(served: Served) -> None:
    key = {"authorization": "Bearer three"}
    with httpx.Client(base_url=served.url, timeout=30) as c:
        answers = [c.post("/tokenize", json={"prompt": "hello"}, headers=key) for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 200]
        assert [r.headers["x-ratelimit-remaining-requests"] for r in answers] == ["2", "1", "0"]
        refused = c.post("/detokenize", json={"tokens": answers[0].json()["tokens"]}, headers=key)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "retry-after" in refused.headers
        # Another tenant is not held up by it.
        assert (
            c.post("/tokenize", json={"prompt": "hi"}, headers={"authorization": "Bearer batch"}).status_code
            == 200
        )
    assert not any(
        r.endpoint is Endpoint.TOKENIZE for r in served.records
    )  # nothing generated, nothing billed
