"""Prices, spend and window budgets end to end as `weir serve` wires them: the admin API sets a
price and a key's money budget over a day in a time zone; the official openai client is served
until the budget's hard limit answers 429 `budget_exceeded` with Retry-After (until local
midnight); the report's spend equals the budget's count and the records; a soft limit alerts."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import openai
import pytest
from prometheus_client import generate_latest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread
from weir.gateway.admission.controller import build_admission
from weir.gateway.admission.window_budget_gate import WindowBudgetMetrics
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.routes.spend_admin import spend_admin_routes
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

ADMIN = {"authorization": "Bearer admin-secret"}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, GatewayMetrics]]:
    settings = Settings(
        data_dir=tmp_path, admin_token="admin-secret", auth=AuthMode.KEYS, auth_cache_ttl_s=0.05
    )
    tenancy = build_tenancy(settings)
    assert tenancy.repo is not None and tenancy.admin_auth is not None
    engine = FakeEngine()
    engine.eos_after = 2
    metrics = GatewayMetrics(engine.stats)
    admission = build_admission(
        settings, engine.stats, AdmissionMetrics(metrics.registry), WindowBudgetMetrics(metrics.registry)
    )
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        admission=admission,
        metrics=metrics,
        extra_routes=[*spend_admin_routes(tenancy.repo.db, tenancy.admin_auth), *tenancy.routes],
        on_startup=[h for h in (tenancy.start, admission.start) if h is not None],
        on_shutdown=[h for h in (admission.close, tenancy.close) if h is not None],
    )
    with serve_in_thread(app) as url:
        yield url, metrics


def _wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "usage not settled in time"
        time.sleep(0.05)


def test_a_key_money_budget_is_spent_then_refuses_until_local_midnight(
    server: tuple[str, GatewayMetrics],
) -> None:
    url, gateway_metrics = server
    with httpx.Client(base_url=url, headers=ADMIN) as admin:
        # Prices: money is decimal text, never a JSON number; a price may not start in the past.
        r = admin.post(
            "/admin/v1/prices", json={"model": MODEL, "input_per_million": 1, "output_per_million": "2"}
        )
        assert r.status_code == 422 and "input_per_million" in r.json()["error"]["message"]
        past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
        r = admin.post("/admin/v1/prices", json={"model": MODEL, "input_per_million": "1",
                                                 "output_per_million": "2", "effective_from": past})  # fmt: skip
        assert r.status_code == 422 and "effective_from" in r.json()["error"]["message"]
        r = admin.post(
            "/admin/v1/prices", json={"model": MODEL, "input_per_million": "1", "output_per_million": "2"}
        )
        assert r.status_code == 201, r.text
        assert (
            r.json()["output_micros_per_million"] == 2_000_000
            and r.json()["cached_input_per_million"] == "1.000000"
        )
        assert admin.post("/admin/v1/tenants", json={"name": "acme"}).status_code == 201
        issued = admin.post("/admin/v1/tenants/acme/keys", json={}).json()
        body = {"tenant": "acme", "key_id": issued["id"], "unit": "micros", "window": "day",
                "time_zone": "Asia/Kathmandu", "soft_limit": 1, "hard_limit": 400}  # fmt: skip
        r = admin.put("/admin/v1/budgets", json=body)
        assert r.status_code == 200, r.text
        budget = r.json()
        assert budget["used"] == 0
        midnight = dt.datetime.fromisoformat(budget["resets_at"]).astimezone(ZoneInfo("Asia/Kathmandu"))
        assert (midnight.hour, midnight.minute, midnight.second) == (0, 0, 0)
        assert admin.put("/admin/v1/budgets", json={**body, "time_zone": "Nowhere/City"}).status_code == 422
    # The soft limit is crossed by the first request's spend, whatever the number served: the
    # settlement of one request can land after the next one's reservation, so as few as two may
    # be served before the hard limit refuses, and their spend alone need not reach a larger limit.
    served = 0
    with openai.OpenAI(base_url=url + "/v1", api_key=issued["key"], max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as info:
            for _ in range(100):
                # Reserves prompt * 1 + 100 * 2 micro-units; spends prompt + 2 * 2 (eos after 2).
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
                served += 1
    assert served >= 2
    response = info.value.response
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "budget_exceeded"
    to_midnight = (midnight - dt.datetime.now(dt.UTC)).total_seconds()
    assert abs(int(response.headers["retry-after"]) - to_midnight) < 60
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    with httpx.Client(base_url=url, headers=ADMIN) as admin:

        def report() -> dict[str, object]:
            params = {"since": since, "until": until, "group_by": "key"}
            body = admin.get("/admin/v1/usage/report", params=params).json()
            assert isinstance(body, dict)
            return body

        _wait_for(lambda: report()["totals"]["requests"] == served)  # type: ignore[index]
        totals = report()["totals"]
        assert isinstance(totals, dict) and totals["unpriced"] == 0
        # Prices of 1 and 2 per million tokens: the spend in micro-units is exact, no rounding.
        assert totals["spend_micros"] == totals["prompt_tokens"] + 2 * totals["completion_tokens"]
        _wait_for(lambda: admin.get("/admin/v1/budgets").json()["data"][0]["used"] == totals["spend_micros"])
        csv_text = admin.get("/admin/v1/usage/report", params={"since": since, "until": until,
                                                                 "group_by": "key", "format": "csv"}).text  # fmt: skip
        assert csv_text.splitlines()[0].endswith("spend_micros,unpriced")

        def actions() -> list[str]:
            audit = admin.get("/admin/v1/audit", params={"tenant": "acme"}).json()["data"]
            return [e["action"] for e in audit]

        # The soft alert is audited when the crossing request settles, after its answer.
        _wait_for(lambda: "budget.soft_limit" in actions())
        assert actions().count("budget.soft_limit") == 1 and "budget.set" in actions()
        assert admin.get("/admin/v1/audit").json()["data"][-1]["action"] == "price.set"
        metrics = generate_latest(gateway_metrics.registry).decode()
        assert (
            'weir_budget_soft_limit_alerts_total{scope="key",tenant="acme",unit="micros",window="day (Asia/Kathmandu)"} 1.0'
            in metrics
        )
        assert "weir_budget_hard_limit_refusals_total" in metrics
        # Removing the budget lets the key spend again (within the refresh delay).
        budget_id = admin.get("/admin/v1/budgets").json()["data"][0]["id"]
        assert admin.delete(f"/admin/v1/budgets/{budget_id}").status_code == 200
        assert admin.delete(f"/admin/v1/budgets/{budget_id}").status_code == 404
    time.sleep(0.1)
    with openai.OpenAI(base_url=url + "/v1", api_key=issued["key"], max_retries=0) as client:
        assert client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100).choices  # type: ignore[arg-type]
