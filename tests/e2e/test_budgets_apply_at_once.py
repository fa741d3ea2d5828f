"""Window budgets apply at once on the replica that set them (issue 54), as `weir serve` wires
them, on SQLite and PostgreSQL: right after `PUT /admin/v1/budgets`, 20 concurrent requests are
admitted only while their reservations fit (the rest get 429 `budget_exceeded` with Retry-After),
so what is served never passes the hard limit; `used` read back is never below what was served;
and traffic served before the budget was set counts in its window.

The auth cache TTL (how often budgets are re-read) is left at a long 30 s: nothing here may rely
on a periodic refresh. Windows are rolling hours, so no test straddles a window's reset.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import text

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.gateway.admission.controller import build_admission
from weir.gateway.admission.window_budget_gate import WindowBudgetMetrics
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.routes.spend_admin import spend_admin_routes
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings
from weir.migrations.migrate import upgrade
from weir.tenancy.store.db import Database

ADMIN = {"authorization": "Bearer admin-secret"}
MESSAGES: Any = [{"role": "user", "content": "hello"}]
ROLLING_HOUR = {"window": "rolling", "rolling_s": 3600}
PG_ENV = "WEIR_TEST_PG_URL"
MAX_TOKENS = 20  # each request reserves its prompt + 20 tokens
PERIOD = {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z", "tenant": "acme"}
EOS_AFTER = 10  # and is served its prompt + 10: twenty of them are always more than a limit of 200


@dataclass
class Served:
    url: str
    key: str
    key_id: str


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'weir.db'}"
        db = Database(url)
        upgrade(db.engine)
        db.dispose()
        yield url
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set (source .ci/postgres.sh)")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = Database(base)
    with admin.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{base}?options=-csearch_path%3D{schema}"
    db = Database(url)
    upgrade(db.engine)
    db.dispose()
    try:
        yield url
    finally:
        with admin.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def server(tmp_path: Path, database_url: str) -> Iterator[Served]:
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        admin_token="admin-secret",
        auth=AuthMode.KEYS,
        auth_cache_ttl_s=30.0,
    )
    tenancy = build_tenancy(settings)
    assert tenancy.repo is not None and tenancy.admin_auth is not None
    engine = FakeEngine(token_delay_s=0.01)  # requests stay in flight together
    engine.eos_after = EOS_AFTER
    metrics = GatewayMetrics(engine.stats)
    admission = build_admission(
        settings, engine.stats, AdmissionMetrics(metrics.registry), WindowBudgetMetrics(metrics.registry)
    )
    assert admission.window_budgets is not None
    spend = spend_admin_routes(tenancy.repo.db, tenancy.admin_auth, admission.window_budgets.refresh_now)
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        admission=admission,
        metrics=metrics,
        extra_routes=[*spend, *tenancy.routes],  # as bootstrap wires them
        on_startup=[h for h in (tenancy.start, admission.start) if h is not None],
        on_shutdown=[h for h in (admission.close, tenancy.close) if h is not None],
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN) as admin:
        r = admin.post("/admin/v1/prices", json={"model": MODEL, "input_per_million": "1",
                                                 "output_per_million": "2"})  # fmt: skip
        assert r.status_code == 201, r.text
        assert admin.post("/admin/v1/tenants", json={"name": "acme"}).status_code == 201
        issued = admin.post("/admin/v1/tenants/acme/keys", json={}).json()
        # Another tenant's request first: the replica has read the (no) budgets before the
        # admin change, as a serving replica has; the change must not wait for the next read.
        assert admin.post("/admin/v1/tenants", json={"name": "other"}).status_code == 201
        other = admin.post("/admin/v1/tenants/other/keys", json={}).json()
        asyncio.run(_burst(Served(url, other["key"], other["id"]), 1))
        yield Served(url, issued["key"], issued["id"])


def _spend(usage: Any) -> int:
    """Micro-units at 1 per prompt token and 2 per completion token (the fixture's price)."""
    return int(usage.prompt_tokens + 2 * usage.completion_tokens)


async def _burst(server: Served, n: int) -> tuple[list[Any], list[openai.RateLimitError]]:
    """`n` concurrent chat completions; the usages served and the 429s."""
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=server.key, max_retries=0) as client:

        async def one() -> Any:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS)

        results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    served = [r.usage for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    others = [r for r in results if isinstance(r, BaseException) and not isinstance(r, openai.RateLimitError)]
    assert not others, others
    return served, refused


def _used(admin: httpx.Client, budget_id: int) -> int:
    budgets = admin.get("/admin/v1/budgets").json()["data"]
    return int(next(b["used"] for b in budgets if b["id"] == budget_id))


@pytest.mark.parametrize(
    ("principal", "unit", "limit"),
    [("tenant", "tokens", 200), ("key", "tokens", 200), ("key", "micros", 300)],
)
def test_a_budget_set_then_hit_at_once_by_20_requests_holds(
    server: Served, principal: str, unit: str, limit: int
) -> None:
    body = {"tenant": "acme", "unit": unit, "hard_limit": limit, **ROLLING_HOUR}
    if principal == "key":
        body["key_id"] = server.key_id
    with httpx.Client(base_url=server.url, headers=ADMIN) as admin:
        r = admin.put("/admin/v1/budgets", json=body)
        assert r.status_code == 200, r.text
        budget_id = r.json()["id"]
        served, refused = asyncio.run(_burst(server, 20))
        cost = [u.total_tokens if unit == "tokens" else _spend(u) for u in served]
        # Every admission fit its reservation (prompt + max_tokens) beside the ones in flight, and
        # each request used at most what it reserved: what was served stays within the limit.
        assert served and sum(cost) <= limit
        assert refused and len(served) + len(refused) == 20
        for error in refused:
            assert isinstance(error.body, dict) and error.body["code"] == "budget_exceeded"
            assert int(error.response.headers["retry-after"]) >= 1
        # In flight a request counts its reservation, settled what it used: never less.
        assert _used(admin, budget_id) >= sum(cost)
        assert wait_until(lambda: _used(admin, budget_id) == sum(cost), timeout_s=30)


def test_traffic_before_a_budget_counts_in_its_window(server: Served) -> None:
    served, refused = asyncio.run(_burst(server, 3))
    assert len(served) == 3 and not refused
    tokens = sum(u.total_tokens for u in served)
    with httpx.Client(base_url=server.url, headers=ADMIN) as admin:

        def recorded() -> bool:
            report = admin.get("/admin/v1/usage/report", params=PERIOD).json()
            return bool(report["totals"]["requests"] == 3)

        assert wait_until(recorded, timeout_s=30)  # the usage records are written
        for body, used in (
            ({"tenant": "acme", "unit": "tokens", "hard_limit": 10_000}, tokens),
            ({"tenant": "acme", "key_id": server.key_id, "unit": "micros", "soft_limit": 1}, sum(map(_spend, served))),
        ):  # fmt: skip
            r = admin.put("/admin/v1/budgets", json={**body, **ROLLING_HOUR})
            assert r.status_code == 200, r.text
            assert r.json()["used"] == used
        # A tenant budget already spent by that traffic refuses at once.
        r = admin.put("/admin/v1/budgets", json={"tenant": "acme", "unit": "tokens", "window": "rolling",
                                                 "rolling_s": 7200, "hard_limit": tokens})  # fmt: skip
        assert r.status_code == 200 and r.json()["used"] == tokens
    served, refused = asyncio.run(_burst(server, 1))
    assert not served and len(refused) == 1
