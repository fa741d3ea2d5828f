"""Two gateway replicas share one PostgreSQL database.

Over the fake engine (uvicorn subprocesses): a burst of parallel requests admits at most the
budget plus one lease per replica. Over the real engine (two `weir serve` processes with a tiny
random Llama): the shared budget holds and ends exact, usage from both replicas adds up exactly,
and a key revoked through one replica is refused by the other within its auth cache TTL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import MODEL, wait_until
from weir.migrations.migrate import upgrade
from weir.tenancy.budgets.leases import LeaseStore
from weir.tenancy.context import QuotaLimits
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir_bench.replica_set import revoke_key, run_replicas

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


# -- two real `weir serve` processes (real engine, tiny random Llama) on one PostgreSQL --------------

AUTH_TTL_S = 2.0  # --auth-cache-ttl-s of the real replicas: how long revocation may take elsewhere
REAL_BUDGET = 2_000
REAL_LEASE = 200


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("replica-model"), arch="llama", num_kv_heads=2)


def _completion(client: httpx.Client, key: str, max_tokens: int) -> httpx.Response:
    body = {"model": "tiny", "prompt": "one two three four five six seven eight", "max_tokens": max_tokens}
    return client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})


@pytest.mark.slow
def test_two_weir_serve_replicas_share_budgets_usage_and_revocations(
    database_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    db = Database(database_url)
    upgrade(db.engine)  # `weir serve` never migrates PostgreSQL
    repo = TenancyRepo(db, KeyHasher.from_pepper(PEPPER))
    limits = QuotaLimits(tokens_per_day=REAL_BUDGET)
    repo.create_tenant(TenantSpec(name="capped", quota=limits), actor="test")
    repo.create_tenant(TenantSpec(name="metered"), actor="test")
    capped = repo.issue_key("capped", KeySpec(), actor="test").key
    metered = repo.issue_key("metered", KeySpec(), actor="test")
    flags = ["--served-model-name", "tiny", "--lease-tokens", str(REAL_LEASE)]
    flags += ["--auth-cache-ttl-s", str(AUTH_TTL_S), "--kv-cache-tokens", "4096"]
    with run_replicas(tiny_model, database_url, PEPPER, tmp_path, flags=flags) as (a, b):
        clients = [httpx.Client(base_url=r.url, timeout=120) for r in (a, b)]
        try:
            # Usage from both replicas: every answered token is recorded once.
            metered_ok = [_completion(clients[i % 2], metered.key, 8) for i in range(8)]
            assert [r.status_code for r in metered_ok] == [200] * 8, [r.text for r in metered_ok]

            # A budget shared by both: a burst of 1.5 budgets' worth over both replicas.
            with ThreadPoolExecutor(max_workers=6) as pool:
                burst = list(pool.map(lambda i: _completion(clients[i % 2], capped, 40), range(60)))
            statuses = {r.status_code for r in burst}
            assert statuses <= {200, 429}, [r.text for r in burst if r.status_code not in (200, 429)]
            assert 429 in statuses and {i % 2 for i, r in enumerate(burst) if r.status_code == 200} == {0, 1}

            # Revocation through replica A: A refuses at once, B (which cached the key) within its TTL.
            warm = _completion(clients[1], metered.key, 1)
            assert warm.status_code == 200
            revoke_key(a, metered.view.id)
            assert _completion(clients[0], metered.key, 1).status_code == 401
            # Until B's cached lookup expires it still serves the key; each such answer is billed.
            polls: list[httpx.Response] = []

            def refused_on_b() -> bool:
                time.sleep(0.1)
                polls.append(_completion(clients[1], metered.key, 1))
                return polls[-1].status_code == 401

            assert wait_until(refused_on_b, AUTH_TTL_S + 5)
            assert {r.status_code for r in polls[:-1]} <= {200}
        finally:
            for c in clients:
                c.close()
    # Both replicas stopped gracefully: every usage record written, every unused lease returned.
    answered = [r for r in burst if r.status_code == 200]
    used = sum(r.json()["usage"]["total_tokens"] for r in answered)
    assert used <= REAL_BUDGET  # every admitted token was leased from the one budget
    state = LeaseStore(db).state("capped", limits)
    assert state is not None and state.day_remaining == REAL_BUDGET - used  # exact, nothing stranded
    (capped_day,) = repo.usage_by_day("capped")
    assert capped_day.total_tokens == used and capped_day.num_completed == len(answered)
    # The 8 metered requests, the one that warmed B's cache and B's answers until it expired.
    metered_answered = [*metered_ok, warm, *(r for r in polls if r.status_code == 200)]
    metered_used = sum(r.json()["usage"]["total_tokens"] for r in metered_answered)
    (metered_day,) = repo.usage_by_day("metered")
    assert (metered_day.num_completed, metered_day.total_tokens) == (len(metered_answered), metered_used)
    db.dispose()
