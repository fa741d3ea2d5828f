"""Authentication under failure: the revocation race, and the database unavailable or locked."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from tests.gateway.auth_doubles import ACME, ADDR, GLOBEX, Clocks, CountingRepo, bearer, open_repo
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import AuthenticationError, DatabaseUnavailableError, PermissionDeniedError
from weir.tenancy.keys.keys import generate_admin_token, generate_key
from weir.tenancy.repository.records import KeyRecord, KeySpec, TenantSpec


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def repo(tmp_path: Path, clocks: Clocks) -> Iterator[CountingRepo]:
    with open_repo(CountingRepo, tmp_path / "weir.db", clocks, ACME, GLOBEX) as repo:
        yield repo


# -- the revocation race ----------------------------------------------------------------------------


class PausingRepo(CountingRepo):
    """Holds the next `lookup_key` after it has read the row, until the test releases it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
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


@pytest.fixture
def pausing(tmp_path: Path, clocks: Clocks) -> Iterator[PausingRepo]:
    with open_repo(PausingRepo, tmp_path / "race.db", clocks, TenantSpec("acme")) as repo:
        yield repo


def _paused_lookup(repo: PausingRepo, auth: Authenticator, key: str) -> list[object]:
    """Start an authentication on a thread; return once its lookup has read the (active) row."""
    results: list[object] = []

    def run() -> None:
        try:
            results.append(auth.authenticate(bearer(key), ADDR))
        except Exception as exc:  # collected for the assertion in the test
            results.append(exc)

    repo.pause_next = True
    thread = threading.Thread(target=run)
    thread.start()
    assert repo.read.wait(30)
    results.append(thread)
    return results


@pytest.mark.parametrize("change", ["revoke", "suspend"])
def test_a_lookup_that_started_before_a_change_does_not_cache_the_old_state(
    pausing: PausingRepo, clocks: Clocks, change: str
) -> None:
    auth = Authenticator(pausing, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
    issued = pausing.issue_key("acme", KeySpec(), actor="t")
    results = _paused_lookup(pausing, auth, issued.key)
    # What the admin route does while the lookup is paused: change the database, then invalidate.
    if change == "revoke":
        pausing.revoke_key(issued.view.id, actor="t")
        auth.invalidate(issued.view.id)
    else:
        pausing.suspend_tenant("acme", actor="t")
        auth.invalidate_tenant("acme")
    pausing.resume.set()
    thread = results.pop()
    assert isinstance(thread, threading.Thread)
    thread.join(30)
    # The paused request began before the change and may be served; the next one must not be.
    assert results and getattr(results[0], "tenant_id", None) == "acme"
    expected = AuthenticationError if change == "revoke" else PermissionDeniedError
    with pytest.raises(expected):
        auth.authenticate(bearer(issued.key), ADDR)


# -- the database unavailable -----------------------------------------------------------------------


class BrokenRepo(CountingRepo):
    """A database that answers nothing: every lookup fails as a locked or unreachable one does."""

    broken = False

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        if self.broken:
            self.lookups += 1
            raise OperationalError("SELECT ...", {}, sqlite3.OperationalError("database is locked"))
        return super().lookup_key(key_id, timeout_s=timeout_s)

    def admin_token_hash(self) -> str | None:
        if self.broken:
            raise OperationalError("SELECT ...", {}, sqlite3.OperationalError("database is locked"))
        return super().admin_token_hash()


@pytest.fixture
def broken(tmp_path: Path, clocks: Clocks) -> Iterator[BrokenRepo]:
    with open_repo(BrokenRepo, tmp_path / "broken.db", clocks, TenantSpec("acme")) as repo:
        yield repo


def test_an_unavailable_database_fails_closed_with_503(broken: BrokenRepo, clocks: Clocks) -> None:
    auth = Authenticator(broken, AuthSettings(), timer=clocks.timer)
    cached = broken.issue_key("acme", KeySpec(), actor="t")
    uncached = broken.issue_key("acme", KeySpec(), actor="t")
    auth.authenticate(bearer(cached.key), ADDR)
    broken.broken = True
    for key in (uncached.key, generate_key().key):  # a valid key and an unknown one alike
        with pytest.raises(DatabaseUnavailableError) as info:
            asyncio.run(auth.authenticate_async(bearer(key), ADDR))
        assert info.value.status_code == 503 and info.value.headers["Retry-After"] == "1"
        assert info.value.body()["error"]["code"] == "database_unavailable"
    assert auth.authenticate(bearer(cached.key), ADDR).tenant_id == "acme"  # served from the cache
    with pytest.raises(AuthenticationError):  # no key at all needs no database: still 401
        auth.authenticate(None, ADDR)
    broken.broken = False
    assert auth.authenticate(bearer(uncached.key), ADDR).tenant_id == "acme"


def test_an_unavailable_database_gives_503_for_the_stored_admin_token(
    broken: BrokenRepo, clocks: Clocks
) -> None:
    token = generate_admin_token()
    broken.store_admin_token(token, actor="t", replace=False)
    admin = AdminAuthenticator(broken, None, timer=clocks.timer)
    broken.broken = True
    with pytest.raises(DatabaseUnavailableError):
        admin.authenticate(bearer(token), ADDR)
    broken.broken = False
    admin.authenticate(bearer(token), ADDR)


def test_the_lookup_waits_at_most_its_timeout_on_a_locked_database(
    repo: CountingRepo, clocks: Clocks
) -> None:
    """A writer holding the database does not block an uncached key for the 5 s busy timeout."""
    auth = Authenticator(repo, AuthSettings(touch_timeout_s=0.05), timer=clocks.timer)
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    locker = sqlite3.connect(repo.db.url.database or "", isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")  # WAL: readers go on, writers wait
        ctx = auth.authenticate(bearer(issued.key), ADDR)  # the read works; touching is skipped
        assert ctx.tenant_id == "acme"
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert repo.get_key(issued.view.id).last_used_at is None  # the best-effort write gave up
