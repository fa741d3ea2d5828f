"""Two gateway replicas (uvicorn subprocesses over the fake engine) share one PostgreSQL database:
a burst of parallel requests admits at most the budget plus one lease per replica."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tenancy.context import QuotaLimits
from tenancy.db import Database
from tenancy.keys import KeyHasher
from tenancy.leases import LeaseStore
from tenancy.migrate import upgrade
from tenancy.records import KeySpec, TenantSpec
from tenancy.repo import TenancyRepo
from tests.gateway.harness import MODEL, wait_until

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
PEPPER = "replica-test-pepper"
BUDGET = 3_000  # tokens per day: no refill during the test, so the bound is exact
LEASE = 200
PROMPT, MAX_TOKENS = 10, 40  # 50 tokens reserved and used per request
NUM_REQUESTS = 90  # 4,500 tokens asked for: 1.5 times the budget


@pytest.fixture
def database_url() -> Iterator[str]:
    base = os.environ.get("WEIR_TEST_PG_URL")
    if not base:
        pytest.skip("WEIR_TEST_PG_URL is not set (source .ci/postgres.sh)")
    schema = f"r_{uuid.uuid4().hex[:16]}"
    admin = Database(base)
    with admin.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with admin.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class Replica:
    """One `tests.e2e.replica_server` subprocess."""

    def __init__(self, database_url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.replica_server", "--database-url", database_url,
             "--lease-tokens", str(LEASE)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "WEIR_KEY_PEPPER": PEPPER},
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        assert wait_until(lambda: any(x.startswith("PORT ") for x in self.lines), 60), self.lines
        self.url = "http://127.0.0.1:" + next(x for x in self.lines if x.startswith("PORT "))[5:]
        assert wait_until(self._ready, 30), self.lines

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def test_two_replicas_admit_at_most_budget_plus_two_leases(database_url: str) -> None:
    db = Database(database_url)
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher.from_pepper(PEPPER))
    limits = QuotaLimits(tokens_per_day=BUDGET)
    repo.create_tenant(TenantSpec(name="burst", quota=limits), actor="test")
    key = repo.issue_key("burst", KeySpec(), actor="test").key
    replicas = [Replica(database_url), Replica(database_url)]
    try:
        clients = [httpx.Client(base_url=r.url, timeout=60) for r in replicas]

        def send(i: int) -> httpx.Response:
            body = {"model": MODEL, "prompt": [1] * PROMPT, "max_tokens": MAX_TOKENS}
            return clients[i % 2].post(
                "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
            )

        with ThreadPoolExecutor(max_workers=32) as pool:
            responses = list(pool.map(send, range(NUM_REQUESTS)))
        for c in clients:
            c.close()
    finally:
        codes = [r.stop() for r in replicas]
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, [r.text for r in responses if r.status_code not in (200, 429)]
    ok = [r for r in responses if r.status_code == 200]
    admitted = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert all(r.json()["usage"]["total_tokens"] == PROMPT + MAX_TOKENS for r in ok)
    # The bound of the issue, and in fact the budget itself: leases come out of the budget.
    assert admitted <= BUDGET + 2 * LEASE
    assert admitted <= BUDGET
    assert admitted >= BUDGET - 2 * LEASE - (PROMPT + MAX_TOKENS)  # little stranded
    both = {i % 2 for i, r in enumerate(responses) if r.status_code == 200}
    assert both == {0, 1}  # both replicas admitted some
    denied = [r for r in responses if r.status_code == 429]
    assert denied and all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in denied)
    assert all(int(r.headers["retry-after"]) > 0 for r in denied)
    assert all(r.headers["x-ratelimit-limit-tokens"] == str(BUDGET) for r in denied)
    assert codes == [0, 0]
    # Shutdown returned every unused lease: the database counts exactly what was admitted.
    state = LeaseStore(db).state("burst", limits)
    assert state is not None and state.day_remaining == BUDGET - admitted
    db.dispose()
