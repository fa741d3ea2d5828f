"""Issue 10, defect 6, through the real server: with the SQLite file locked, requests on cached
keys are served and their usage records reach the database afterwards, each exactly once.

Before the fix the records were dropped ("could not write the usage record") and never came back.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.metrics.usage_metrics import UsageRecordsCollector
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

ADMIN = {"authorization": "Bearer admin-secret"}
MESSAGES = [{"role": "user", "content": "hello"}]
NUM_CLIENTS = 4
REQUESTS_PER_CLIENT = 5

pytestmark = pytest.mark.slow  # the writer waits out SQLite's 5 s busy timeout once


@dataclass
class Served:
    url: str
    key: str
    database: Path
    registry: CollectorRegistry


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    settings = Settings(data_dir=tmp_path, admin_token="admin-secret", auth=AuthMode.KEYS)
    tenancy = build_tenancy(settings)
    assert tenancy.usage_stats is not None
    engine = FakeEngine()
    # As `weir serve` does: the usage collector is on the registry before the app is built.
    metrics = GatewayMetrics(engine.stats, collectors=[UsageRecordsCollector(tenancy.usage_stats)])
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        metrics=metrics,
        extra_routes=tenancy.routes,
        on_startup=[tenancy.start] if tenancy.start else [],
        on_shutdown=[tenancy.close] if tenancy.close else [],
    )
    registry = metrics.registry
    with serve_in_thread(app) as url:
        with httpx.Client(base_url=url, headers=ADMIN) as admin:
            assert admin.post("/admin/v1/tenants", json={"name": "acme"}).status_code == 201
            key = admin.post("/admin/v1/tenants/acme/keys", json={}).json()["key"]
        yield Served(url, key, tmp_path / "weir.db", registry)


def _pending(served: Served) -> float | None:
    return served.registry.get_sample_value("weir_usage_records_pending")


def _rows(database: Path) -> dict[str, int]:
    with sqlite3.connect(database) as conn:
        return dict(conn.execute("SELECT request_id, count(*) FROM usage_records GROUP BY request_id"))


def test_usage_records_survive_a_locked_database(served: Served) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []
    with openai.OpenAI(base_url=served.url + "/v1", api_key=served.key, max_retries=0) as client:
        warm = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        ids.append(warm.id)  # the key is cached from here on
        # Its record is submitted just after the response, so wait for the row, not only the gauge.
        assert wait_until(lambda: _rows(served.database) == {warm.id: 1} and _pending(served) == 0, 30)

        def tenant_traffic(worker: int) -> None:
            try:
                for i in range(REQUESTS_PER_CLIENT):
                    if i % 2:  # n=2: two choices, one request, one usage record
                        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, n=2)  # type: ignore[arg-type]
                        ids.append(r.id)
                    else:
                        with client.chat.completions.create(
                            model=MODEL,
                            messages=MESSAGES,  # type: ignore[arg-type]
                            max_tokens=3,
                            stream=True,
                        ) as stream:
                            ids.append(next(iter(stream)).id)
                            for _ in stream:
                                pass
            except BaseException as exc:
                errors.append(exc)

        lock = sqlite3.connect(served.database, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # what the reporter did: every write waits, then fails
        try:
            workers = [threading.Thread(target=tenant_traffic, args=(w,)) for w in range(NUM_CLIENTS)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(60)
            assert errors == []  # served while the database is locked
            num_requests = 1 + NUM_CLIENTS * REQUESTS_PER_CLIENT
            assert len(ids) == num_requests
            # Accepted, not written (a stream settles just after its last chunk): the first write
            # waits out SQLite's 5 s busy timeout, then fails.
            assert wait_until(lambda: _pending(served) == num_requests - 1)
            assert wait_until(
                lambda: served.registry.get_sample_value("weir_usage_database_available") == 0, 30
            )
            assert _rows(served.database) == {ids[0]: 1}
        finally:
            lock.execute("ROLLBACK")
            lock.close()
    assert wait_until(lambda: _pending(served) == 0, 30)
    assert _rows(served.database) == {request_id: 1 for request_id in ids}  # every request, once
    assert served.registry.get_sample_value("weir_usage_records_replayed_total") == num_requests - 1
    assert served.registry.get_sample_value("weir_usage_records_dropped_total") == 0
