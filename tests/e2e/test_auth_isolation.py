"""Authentication cannot be turned against other tenants, through a real uvicorn (issue 10).

Defect 3: failures from one address (a load tool started without its key) locked out every
valid key from that address, and X-Forwarded-For from loopback let a client aim the lockout.
Defect 6: an uncached key on a locked database waited 5 s; admin writes answered 500.
The revocation race: a lookup that began before a revoke cached the key as active afterwards.

The server is built as `weir serve` builds it (`weir.gateway.server.uvicorn_runner.uvicorn_config`), on 127.0.0.1,
with small throttle limits so the tests stay short.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.routes.admin import admin_routes
from weir.gateway.server.uvicorn_runner import uvicorn_config
from weir.gateway.settings.settings import AuthMode, LogLevel, Settings
from weir.migrations.migrate import upgrade
from weir.tenancy.keys.keys import KeyHasher, generate_key
from weir.tenancy.repository.records import KeyRecord
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import KeyScope

ADMIN_TOKEN = "admin-token-for-auth-isolation"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
MESSAGES: Any = [{"role": "user", "content": "hello"}]
# Small limits: 5 failures per key id, 20 per address, per minute.
LIMITS = AuthSettings(max_failures=5, max_address_failures=20)


class PausingRepo(TenancyRepo):
    """Holds the next key lookup after it has read the row, until the test releases it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause_next = False
        self.read = threading.Event()
        self.resume = threading.Event()

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        record = super().lookup_key(key_id, timeout_s=timeout_s)
        if self.pause_next:
            self.pause_next = False
            self.read.set()
            assert self.resume.wait(30), "the test never released the lookup"
        return record


@dataclass
class Stack:
    url: str
    repo: PausingRepo
    db_path: Path

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=ADMIN, timeout=30)

    def new_key(self, tenant: str) -> str:
        with self.admin() as admin:
            if admin.get(f"/admin/v1/tenants/{tenant}").status_code == 404:
                assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
            response = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={})
            assert response.status_code == 201, response.text
            return str(response.json()["key"])

    def chat(self, key: str, headers: dict[str, str] | None = None) -> httpx.Response:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        auth = {"authorization": f"Bearer {key}", **(headers or {})}
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=auth, timeout=30)


@contextlib.contextmanager
def serve(tmp_path: Path, **settings_kwargs: Any) -> Iterator[Stack]:
    path = tmp_path / "weir.db"
    # A short default busy timeout: admin writes on the locked database fail in 0.2 s, not 5 s.
    db = Database(f"sqlite:///{path}", busy_timeout_ms=200)
    upgrade(db.engine)
    repo = PausingRepo(db, KeyHasher(b"pepper"))
    authenticator = Authenticator(repo, LIMITS)
    admin_auth = AdminAuthenticator(repo, ADMIN_TOKEN)
    settings = Settings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        auth=AuthMode.KEYS,
        admin_token=ADMIN_TOKEN,
        log_level=LogLevel.WARNING,
        **settings_kwargs,
    )
    app = make_app(
        FakeEngine(),
        settings,
        authenticate=functools.partial(authenticator.authenticate_async, scope=KeyScope.INFERENCE),
        extra_routes=admin_routes(repo, authenticator, admin_auth),
    )
    try:
        with serve_in_thread(app, uvicorn_config(app, settings)) as url:
            yield Stack(url, repo, path)
    finally:
        db.dispose()


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_bogus_keys_from_one_address_never_lock_out_valid_keys(tmp_path: Path) -> None:
    with serve(tmp_path) as stack:
        used = stack.new_key("acme")
        fresh = stack.new_key("globex")  # never used before the flood: not in the auth cache
        assert stack.chat(used).status_code == 200
        statuses = []
        with openai.OpenAI(base_url=stack.url + "/v1", api_key="bogus", max_retries=0) as bogus:
            for _ in range(25):  # a load tool started without its key
                try:
                    bogus.chat.completions.create(model=MODEL, messages=MESSAGES)
                except (openai.AuthenticationError, openai.RateLimitError) as exc:
                    statuses.append(exc.status_code)
        assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
        for _ in range(10):  # and someone guessing secrets of a real key id
            stack.chat(fresh[:-4] + ("aaaa" if not fresh.endswith("aaaa") else "bbbb"))
        for key in (used, fresh):
            with openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0) as client:
                reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
                assert reply.choices[0].message.content is not None
        blocked = stack.chat("bogus")
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert _error(blocked)["code"] == "too_many_auth_failures"


def _flood(stack: Stack, forwarded_for: str) -> None:
    for _ in range(21):
        stack.chat("bogus", {"x-forwarded-for": forwarded_for})


def test_x_forwarded_for_is_ignored_unless_the_proxy_is_configured(tmp_path: Path) -> None:
    with serve(tmp_path) as stack:
        _flood(stack, "203.0.113.9")
        # Counted against 127.0.0.1, the real peer: the header neither aims nor dodges the throttle.
        assert stack.chat("bogus").status_code == 429
        assert stack.chat("bogus", {"x-forwarded-for": "198.51.100.2"}).status_code == 429


def test_x_forwarded_for_from_a_configured_proxy_names_the_client(tmp_path: Path) -> None:
    with serve(tmp_path, forwarded_allow_ips=("127.0.0.1",)) as stack:
        _flood(stack, "203.0.113.9")
        assert stack.chat("bogus", {"x-forwarded-for": "203.0.113.9"}).status_code == 429
        assert stack.chat("bogus").status_code == 401  # the proxy's own address is another client


def test_a_key_revoked_during_its_lookup_is_refused_next_time(tmp_path: Path) -> None:
    with serve(tmp_path) as stack:
        key = stack.new_key("acme")
        key_id = key.split("-")[2]
        results: list[int] = []
        stack.repo.pause_next = True
        thread = threading.Thread(target=lambda: results.append(stack.chat(key).status_code))
        thread.start()
        assert stack.repo.read.wait(30)  # the lookup has read the key as active, and waits
        with stack.admin() as admin:
            assert admin.delete(f"/admin/v1/keys/{key_id}").json()["state"] == "revoked"
        stack.repo.resume.set()
        thread.join(30)
        assert results == [200]  # it began before the revocation
        refused = stack.chat(key)
        assert refused.status_code == 401 and _error(refused)["code"] == "invalid_api_key"


@contextlib.contextmanager
def _reads_blocked(stack: Stack) -> Iterator[None]:
    """Hold the SQLite file so that not even readers get in (WAL lets them past a plain
    BEGIN EXCLUSIVE): exclusive locking mode with a write pending."""
    stack.repo.db.dispose()  # the pool's open connections would keep the lock from being taken
    locker = sqlite3.connect(stack.db_path, isolation_level=None)
    try:
        locker.execute("PRAGMA locking_mode=EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("UPDATE tenants SET weight = weight")
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def test_a_locked_database_fails_closed_with_503_and_serves_cached_keys(tmp_path: Path) -> None:
    with serve(tmp_path) as stack:
        cached = stack.new_key("acme")
        uncached = stack.new_key("globex")
        assert stack.chat(cached).status_code == 200
        with _reads_blocked(stack), stack.admin() as admin:
            for key in (uncached, generate_key().key):  # a valid key and an unknown one
                refused = stack.chat(key)
                assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
                assert _error(refused) == {
                    "message": "The database is unavailable; retry later.",
                    "type": "server_error",
                    "param": None,
                    "code": "database_unavailable",
                }
            assert stack.chat(cached).status_code == 200  # the cache keeps serving
            write = admin.post("/admin/v1/tenants", json={"name": "initech"})
            assert write.status_code == 503 and _error(write)["code"] == "database_unavailable"
        assert stack.chat(uncached).status_code == 200  # and the database is back


def test_a_writer_holding_the_database_does_not_stop_uncached_keys(tmp_path: Path) -> None:
    """A plain write lock (BEGIN EXCLUSIVE, WAL): lookups still read; admin writes answer 503."""
    with serve(tmp_path) as stack:
        key = stack.new_key("acme")
        locker = sqlite3.connect(stack.db_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            assert stack.chat(key).status_code == 200  # last_used_at is skipped, not waited for
            with stack.admin() as admin:
                write = admin.post("/admin/v1/tenants/acme/keys", json={})
                assert write.status_code == 503 and _error(write)["code"] == "database_unavailable"
        finally:
            locker.execute("ROLLBACK")
            locker.close()
