"""Reservations and bills through the real HTTP server and the official openai client (issue 10).

Defect 4: beam search was reserved and billed as one sequence. Defect 8: a chat request without
max_tokens reserved the whole context, so a tenant whose tokens-per-minute is below the context
length could not make a default call at all. The budget runs on an injected, stopped clock: time
moves only when a test moves it, so nothing here depends on timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.fake_engine import FakeEngine, num_beam_tokens
from tests.gateway.harness import MAX_MODEL_LEN, MODEL, make_app, serve_in_thread, wait_until
from weir.engine.request import Priority
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController, build_admission
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.server.bootstrap import build_tenancy, to_usage_record_in
from weir.gateway.settings.settings import AuthMode, Settings
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext

START = 1_900_000_000.0
DEFAULT_RESERVATION = 32  # the server's --default-max-tokens-reservation in this test
MESSAGES = [{"role": "user", "content": "hello"}]

TENANTS = {
    "beams": QuotaLimits(tokens_per_minute=100_000),
    # Below the context (MAX_MODEL_LEN = 256): reserving the whole context refused every default call.
    "small": QuotaLimits(tokens_per_minute=200),
    "debtor": QuotaLimits(tokens_per_minute=120),  # 2 tokens per second
}


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    engine: FakeEngine
    clock: Clock
    budget: LocalBudget
    controller: AdmissionController
    url: str
    records: list[UsageRecord] = field(default_factory=list)

    def client(self, tenant: str) -> openai.OpenAI:
        # No retries: a 429 must surface, not be retried into a pass (or forever).
        return openai.OpenAI(base_url=self.url + "/v1", api_key=tenant, max_retries=0)

    def level(self, tenant: str) -> float:
        bucket = self.budget.allowance(tenant, TENANTS[tenant]).bucket
        assert bucket is not None
        return bucket.level(self.clock.now)

    def reserved(self, tenant: str) -> float:
        assert self.controller.metrics is not None
        for family in self.controller.metrics.reserved_tokens.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("tenant") == tenant:
                    return sample.value
        return 0.0


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = FakeEngine()
    clock = Clock()
    budget = LocalBudget(clock)
    metrics = GatewayMetrics(engine.stats)
    controller = AdmissionController(
        engine.stats,
        budget,
        AdmissionConfig(default_max_tokens_reservation=DEFAULT_RESERVATION),
        metrics=AdmissionMetrics(metrics.registry),
    )
    records: list[UsageRecord] = []

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        name = (authorization or "").removeprefix("Bearer ")
        return TenantContext(name, f"key-{name}", Priority.STANDARD, 1.0, name, TENANTS[name])

    app = make_app(
        engine, authenticate=authenticate, admission=controller, usage_sink=records.append, metrics=metrics
    )
    with serve_in_thread(app) as url:
        yield Served(engine, clock, budget, controller, url, records)


@pytest.fixture
def fresh(served: Served) -> Served:
    served.engine.reset()
    served.records.clear()
    return served


def test_beam_search_is_reserved_and_billed_for_every_beam(fresh: Served) -> None:
    def run(beam_width: int) -> tuple[int, float, float, UsageRecord]:
        before_level, before_reserved = fresh.level("beams"), fresh.reserved("beams")
        count = len(fresh.records)
        with fresh.client("beams") as client:
            r = client.completions.create(
                model=MODEL,
                prompt=[5] * 34,
                max_tokens=24,
                extra_body={"use_beam_search": True, "beam_width": beam_width, "ignore_eos": True},
            )
        assert r.usage is not None and r.usage.completion_tokens == 24  # returned, as OpenAI reports
        assert wait_until(lambda: len(fresh.records) == count + 1)
        record = fresh.records[-1]
        return (
            r.usage.prompt_tokens,
            fresh.reserved("beams") - before_reserved,
            before_level - fresh.level("beams"),  # what settlement charged
            record,
        )

    prompt, reserved_1, billed_1, record_1 = run(1)
    assert prompt == 34
    assert reserved_1 == 34 + 24 == 58  # the figure, for one beam
    assert billed_1 == 58
    prompt, reserved_16, billed_16, record_16 = run(16)
    assert reserved_16 == 34 + 16 * 24  # the prompt once, max_tokens per beam
    computed = num_beam_tokens(16, 24)  # 1 + 23 * 16
    assert billed_16 == 34 + computed
    assert record_16.usage.completion_tokens == 24 and record_16.usage.billed_completion_tokens == computed
    # The usage record that tenancy stores bills the computed tokens.
    assert to_usage_record_in(record_16).completion_tokens == computed
    assert to_usage_record_in(record_1).completion_tokens == 24


def test_a_default_chat_call_works_under_a_budget_smaller_than_the_context(fresh: Served) -> None:
    fresh.engine.eos_after = 8  # the model stops on its own well before the context is used
    with fresh.client("small") as client:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens == 8
    request = fresh.engine.requests[-1]
    assert request.sampling_params.max_tokens == MAX_MODEL_LEN - r.usage.prompt_tokens  # may run on
    assert fresh.reserved("small") == r.usage.prompt_tokens + DEFAULT_RESERVATION
    # Settled on what was used (settlement follows the response's last byte: wait for it).
    assert wait_until(lambda: fresh.level("small") == 200 - r.usage.total_tokens)


def test_overshoot_becomes_debt_that_delays_the_next_call(fresh: Served) -> None:
    with fresh.client("debtor") as client:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        assert r.usage is not None
        assert r.usage.total_tokens == MAX_MODEL_LEN  # ran to the end of the context
        debt = r.usage.total_tokens - 120
        assert wait_until(lambda: fresh.level("debtor") == -debt)  # charged in full, not lost
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=MODEL, prompt=[5] * 9, max_tokens=1)
        # Retry-After waits out the debt and this request's 10 tokens, at 2 tokens per second.
        wait_s = (debt + 10) / 2
        assert info.value.response.headers["retry-after-ms"] == str(int(wait_s * 1000))
        fresh.clock.now += wait_s - 0.5
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt=[5] * 9, max_tokens=1)
        fresh.clock.now += 0.5
        ok = client.completions.create(model=MODEL, prompt=[5] * 9, max_tokens=1)
        assert ok.usage is not None and ok.usage.total_tokens == 10


def test_a_request_that_can_never_fit_is_a_400_not_a_retried_429(fresh: Served) -> None:
    with fresh.client("small") as client, pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[5] * 10, max_tokens=195)
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "request_too_large"
    assert "200 tokens per minute" in body["message"]
    assert "retry-after" not in info.value.response.headers


def test_the_tenant_quota_field_reaches_admission_as_weir_serve_wires_it(tmp_path: Path) -> None:
    """Admin API -> database -> auth cache -> admission: the tenant's own default reservation."""
    settings = Settings(data_dir=tmp_path, admin_token="admin-secret", auth=AuthMode.KEYS)
    tenancy = build_tenancy(settings)
    engine = FakeEngine()
    engine.eos_after = 4
    metrics = GatewayMetrics(engine.stats)
    admission = build_admission(settings, engine.stats, AdmissionMetrics(metrics.registry))
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        admission=admission,
        metrics=metrics,
        extra_routes=tenancy.routes,
        on_startup=[h for h in (tenancy.start, admission.start) if h is not None],
        on_shutdown=[h for h in (admission.close, tenancy.close) if h is not None],
    )
    headers = {"authorization": "Bearer admin-secret"}
    quota = {"tokens_per_minute": 100, "default_max_tokens_reservation": 16}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=headers) as admin:
        r = admin.post("/admin/v1/tenants", json={"name": "lean", "quota": quota})
        assert r.status_code == 201 and r.json()["quota"]["default_max_tokens_reservation"] == 16
        key = admin.post("/admin/v1/tenants/lean/keys", json={}).json()["key"]
        with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
            r2 = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        assert r2.usage is not None and r2.usage.completion_tokens == 4
        reserved = [
            s.value
            for family in admission.metrics.reserved_tokens.collect()
            for s in family.samples
            if s.name.endswith("_total") and s.labels.get("tenant") == "lean"
        ]
        assert reserved == [r2.usage.prompt_tokens + 16]  # not the server's 1,024, not the context
