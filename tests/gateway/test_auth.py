"""Tenant key and admin token authentication: sameness of refusals, cache, throttle, races, outages."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy.exc import OperationalError

from engine.request import Priority
from gateway.auth import AdminAuthenticator, Authenticator, AuthSettings, FailureThrottle, bearer_token
from gateway.errors import (
    AuthenticationError,
    DatabaseUnavailableError,
    PermissionDeniedError,
    RateLimitError,
)
from tenancy.context import QuotaLimits
from tenancy.db import Database
from tenancy.enums import KeyScope
from tenancy.keys import KeyHasher, generate_admin_token, generate_key
from tenancy.migrate import upgrade
from tenancy.records import KeyRecord, KeySpec, TenantSpec
from tenancy.repo import TenancyRepo

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
ADDR = "203.0.113.7"


class Clocks:
    """A wall clock for the repository and a monotonic timer for caches, moved together."""

    def __init__(self) -> None:
        self.now = START
        self.t = 1000.0

    def wall(self) -> dt.datetime:
        return self.now

    def timer(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.t += seconds


class CountingRepo(TenancyRepo):
    """Counts database lookups, to show the cache keeps them off the hot path."""

    lookups = 0

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        self.lookups += 1
        return super().lookup_key(key_id, timeout_s=timeout_s)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def repo(tmp_path: Path, clocks: Clocks) -> Iterator[CountingRepo]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    repo = CountingRepo(db, KeyHasher(b"pepper"), clock=clocks.wall)
    repo.create_tenant(
        TenantSpec("acme", Priority.INTERACTIVE, weight=2.0, quota=QuotaLimits(max_concurrent=8)), actor="t"
    )
    repo.create_tenant(TenantSpec("globex"), actor="t")
    yield repo
    db.dispose()


@pytest.fixture
def auth(repo: CountingRepo, clocks: Clocks) -> Authenticator:
    return Authenticator(
        repo,
        AuthSettings(cache_ttl_s=30, max_failures=5, max_address_failures=12, failure_window_s=60),
        timer=clocks.timer,
    )


def _bearer(key: str) -> str:
    return f"Bearer {key}"


def test_valid_key_gives_the_tenant_context(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    ctx = auth.authenticate(_bearer(issued.key), ADDR)
    assert ctx.tenant_id == "acme" and ctx.key_id == issued.view.id
    assert ctx.priority is Priority.INTERACTIVE and ctx.weight == 2.0
    assert ctx.cache_scope == "acme"
    assert ctx.quota == QuotaLimits(max_concurrent=8)
    assert set(ctx.scopes) == {"inference", "usage"}
    assert auth.authenticate(f"bearer   {issued.key}  ", ADDR) == ctx  # scheme is case-insensitive


def test_every_kind_of_bad_key_gets_the_same_401(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    revoked = repo.issue_key("acme", KeySpec(), actor="t")
    repo.revoke_key(revoked.view.id, actor="t")
    expiring = repo.issue_key("acme", KeySpec(expires_at=START + dt.timedelta(seconds=10)), actor="t")
    good = repo.issue_key("acme", KeySpec(), actor="t")
    clocks.advance(11)
    wrong_secret = good.key[:-4] + ("aaaa" if not good.key.endswith("aaaa") else "bbbb")
    headers = [
        None,  # missing
        "",
        "Basic dXNlcjpwYXNz",  # wrong scheme
        _bearer("sk-not-a-weir-key"),  # malformed
        _bearer(generate_key().key),  # unknown
        _bearer(revoked.key),
        _bearer(expiring.key),
        _bearer(wrong_secret),
        _bearer(generate_admin_token()),  # the admin token is not a tenant key
        "Bearer " + "x" * 5000,
    ]
    bodies = []
    for i, header in enumerate(headers):
        with pytest.raises(AuthenticationError) as info:
            auth.authenticate(header, f"10.0.0.{i}")
        assert info.value.status_code == 401
        bodies.append(info.value.body())
    assert all(body == bodies[0] for body in bodies)
    assert bodies[0]["error"]["code"] == "invalid_api_key"


def test_suspended_tenant_gets_403(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    auth.authenticate(_bearer(issued.key), ADDR)
    repo.suspend_tenant("acme", actor="t")
    auth.invalidate_tenant("acme")
    with pytest.raises(PermissionDeniedError) as info:
        auth.authenticate(_bearer(issued.key), ADDR)
    assert info.value.status_code == 403


def test_scope_is_enforced(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(scopes=(KeyScope.INFERENCE,)), actor="t")
    auth.authenticate(_bearer(issued.key), ADDR, scope=KeyScope.INFERENCE)
    with pytest.raises(PermissionDeniedError):
        auth.authenticate(_bearer(issued.key), ADDR, scope=KeyScope.USAGE)


def test_cache_keeps_lookups_off_the_database(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    for _ in range(50):
        auth.authenticate(_bearer(issued.key), ADDR)
    assert repo.lookups == 1
    assert repo.get_key(issued.view.id).last_used_at == START  # written on the miss
    clocks.advance(31)  # past the TTL: one more lookup
    auth.authenticate(_bearer(issued.key), ADDR)
    assert repo.lookups == 2


def test_revocation_invalidates_locally_at_once_and_elsewhere_within_the_ttl(
    repo: CountingRepo, clocks: Clocks
) -> None:
    here = Authenticator(repo, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
    other_replica = Authenticator(repo, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    here.authenticate(_bearer(issued.key), ADDR)
    other_replica.authenticate(_bearer(issued.key), ADDR)
    repo.revoke_key(issued.view.id, actor="t")
    here.invalidate(issued.view.id)  # what the admin route does
    with pytest.raises(AuthenticationError):
        here.authenticate(_bearer(issued.key), ADDR)
    other_replica.authenticate(_bearer(issued.key), ADDR)  # still cached: the documented window
    clocks.advance(30)
    with pytest.raises(AuthenticationError):
        other_replica.authenticate(_bearer(issued.key), ADDR)


def test_expiry_applies_even_to_a_cached_key(repo: CountingRepo, auth: Authenticator, clocks: Clocks) -> None:
    issued = repo.issue_key("acme", KeySpec(expires_at=START + dt.timedelta(seconds=5)), actor="t")
    auth.authenticate(_bearer(issued.key), ADDR)
    clocks.advance(5)
    with pytest.raises(AuthenticationError):
        auth.authenticate(_bearer(issued.key), ADDR)


def test_a_valid_key_is_never_refused_because_of_other_clients_failures(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    """Defect 3: a load tool started without its key locked out every tenant on the machine."""
    cached = repo.issue_key("acme", KeySpec(), actor="t")
    uncached = repo.issue_key("globex", KeySpec(), actor="t")
    auth.authenticate(_bearer(cached.key), ADDR)
    answers = []
    for i in range(30):  # past both the per-key and the per-address bar
        header = None if i % 2 else _bearer(generate_key().key)
        with pytest.raises((AuthenticationError, RateLimitError)) as info:
            auth.authenticate(header, ADDR)
        answers.append(info.value.status_code)
    assert answers[:12] == [401] * 12 and set(answers[12:]) == {429}  # the address bar is 12
    assert auth.authenticate(_bearer(cached.key), ADDR).tenant_id == "acme"
    assert auth.authenticate(_bearer(uncached.key), ADDR).tenant_id == "globex"
    with pytest.raises(RateLimitError) as blocked:
        auth.authenticate(None, ADDR)
    assert 1 <= int(blocked.value.headers["Retry-After"]) <= 60
    assert blocked.value.body()["error"]["code"] == "too_many_auth_failures"
    with pytest.raises(AuthenticationError):
        auth.authenticate(None, "198.51.100.1")  # other addresses are unaffected: 401, not 429
    clocks.advance(60)
    with pytest.raises(AuthenticationError):
        auth.authenticate(None, ADDR)  # the window is over


def test_wrong_secrets_count_against_the_key_id_not_the_key(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    wrong = issued.key[:-4] + ("aaaa" if not issued.key.endswith("aaaa") else "bbbb")
    answers = []
    for i in range(7):  # from seven addresses: the per-address bar is never reached
        with pytest.raises((AuthenticationError, RateLimitError)) as info:
            auth.authenticate(_bearer(wrong), f"10.9.0.{i}")
        answers.append(info.value.status_code)
    assert answers == [401] * 5 + [429] * 2  # max_failures = 5 per key id
    assert auth.authenticate(_bearer(issued.key), "10.9.0.1").key_id == issued.view.id
    with pytest.raises(AuthenticationError):  # another id from the same address: its own count
        auth.authenticate(_bearer(generate_key().key), "10.9.0.1")


def test_an_unknown_id_is_looked_up_once_per_ttl(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    unknown = generate_key().key
    for i in range(4):
        with pytest.raises(AuthenticationError):
            auth.authenticate(_bearer(unknown), f"10.8.0.{i}")
    assert repo.lookups == 1
    clocks.advance(31)
    with pytest.raises(AuthenticationError):
        auth.authenticate(_bearer(unknown), ADDR)
    assert repo.lookups == 2


def test_throttle_memory_is_bounded(clocks: Clocks) -> None:
    throttle = FailureThrottle(3, 60, max_tracked=100, timer=clocks.timer)
    for i in range(1000):
        throttle.record_failure(f"subject-{i}")
    assert throttle.num_tracked <= 100


def test_async_variant(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("globex", KeySpec(), actor="t")
    ctx = asyncio.run(auth.authenticate_async(_bearer(issued.key), ADDR))
    assert ctx.tenant_id == "globex"
    again = asyncio.run(auth.authenticate_async(_bearer(issued.key), ADDR))
    assert again == ctx and repo.lookups == 1
    with pytest.raises(AuthenticationError):
        asyncio.run(auth.authenticate_async(None, ADDR))


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("BEARER abc") == "abc"
    for bad in (None, "", "Bearer", "Bearer ", "Token abc", "Bearer a b"):
        assert bearer_token(bad) is None


def test_auth_settings_validation() -> None:
    with pytest.raises(ValueError, match="cache_ttl_s"):
        AuthSettings(cache_ttl_s=0)
    with pytest.raises(ValueError, match="max_failures"):
        AuthSettings(max_failures=0)
    with pytest.raises(ValueError, match="max_address_failures"):
        AuthSettings(max_address_failures=0)
    with pytest.raises(ValueError, match="lookup_timeout_s"):
        AuthSettings(lookup_timeout_s=float("nan"))


# -- admin token -----------------------------------------------------------------------------------


def test_admin_token_stored_hash(repo: CountingRepo, clocks: Clocks) -> None:
    admin = AdminAuthenticator(repo, None, timer=clocks.timer)
    token = generate_admin_token()
    with pytest.raises(AuthenticationError):  # nothing stored yet: admin API closed
        admin.authenticate(_bearer(token), ADDR)
    repo.store_admin_token(token, actor="t", replace=False)
    admin.invalidate()
    admin.authenticate(_bearer(token), ADDR)
    tenant_key = repo.issue_key("acme", KeySpec(), actor="t").key
    for header in (None, _bearer(tenant_key), _bearer(token + "x"), token):
        with pytest.raises(AuthenticationError) as info:
            admin.authenticate(header, "10.1.1.1")
        assert info.value.status_code == 401


def test_configured_admin_token_wins(repo: CountingRepo, clocks: Clocks) -> None:
    stored = generate_admin_token()
    repo.store_admin_token(stored, actor="t", replace=False)
    admin = AdminAuthenticator(repo, "operator-chosen-token-0123456789", timer=clocks.timer)
    admin.authenticate(_bearer("operator-chosen-token-0123456789"), ADDR)
    asyncio.run(admin.authenticate_async(_bearer("operator-chosen-token-0123456789"), ADDR))
    with pytest.raises(AuthenticationError):
        admin.authenticate(_bearer(stored), ADDR)


def test_admin_failures_are_throttled_but_never_the_token(repo: CountingRepo, clocks: Clocks) -> None:
    throttle = FailureThrottle(3, 60, timer=clocks.timer)
    admin = AdminAuthenticator(
        repo, "operator-chosen-token-0123456789", throttle=throttle, timer=clocks.timer
    )
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            admin.authenticate(_bearer("guess"), ADDR)
    with pytest.raises(RateLimitError):
        admin.authenticate(_bearer("guess"), ADDR)
    admin.authenticate(_bearer("operator-chosen-token-0123456789"), ADDR)  # the real token passes


# -- the throttle against a model -------------------------------------------------------------------


class ThrottleMachine(RuleBasedStateMachine):
    """FailureThrottle behaves like a plain per-address fixed-window counter."""

    MAX = 3
    WINDOW = 10.0

    @initialize()
    def setup(self) -> None:
        self.t = 0.0
        self.throttle = FailureThrottle(self.MAX, self.WINDOW, timer=lambda: self.t)
        self.model: dict[str, tuple[float, int]] = {}

    def _blocked(self, addr: str) -> bool:
        window = self.model.get(addr)
        return window is not None and window[1] >= self.MAX and self.t < window[0] + self.WINDOW

    @rule(addr=st.sampled_from(["a", "b", "c"]))
    def fail(self, addr: str) -> None:
        blocked = self._blocked(addr)
        try:
            self.throttle.check(addr)
        except RateLimitError:
            assert blocked
            return
        assert not blocked
        self.throttle.record_failure(addr)
        window = self.model.get(addr)
        if window is None or self.t >= window[0] + self.WINDOW:
            self.model[addr] = (self.t, 1)
        else:
            self.model[addr] = (window[0], window[1] + 1)

    @rule(seconds=st.floats(0, 15))
    def wait(self, seconds: float) -> None:
        self.t += seconds

    @invariant()
    def check_matches_model(self) -> None:
        if not hasattr(self, "throttle"):
            return
        for addr in ("a", "b", "c"):
            try:
                self.throttle.check(addr)
                refused = False
            except RateLimitError as exc:
                refused = True
                assert 1 <= int(exc.headers["Retry-After"]) <= self.WINDOW
            assert refused == self._blocked(addr)


ThrottleMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_throttle_state_machine = ThrottleMachine.TestCase


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
    db = Database(f"sqlite:///{tmp_path / 'race.db'}")
    upgrade(db.engine)
    repo = PausingRepo(db, KeyHasher(b"pepper"), clock=clocks.wall)
    repo.create_tenant(TenantSpec("acme"), actor="t")
    yield repo
    db.dispose()


def _paused_lookup(repo: PausingRepo, auth: Authenticator, key: str) -> list[object]:
    """Start an authentication on a thread; return once its lookup has read the (active) row."""
    results: list[object] = []

    def run() -> None:
        try:
            results.append(auth.authenticate(_bearer(key), ADDR))
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
        auth.authenticate(_bearer(issued.key), ADDR)


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
    db = Database(f"sqlite:///{tmp_path / 'broken.db'}")
    upgrade(db.engine)
    repo = BrokenRepo(db, KeyHasher(b"pepper"), clock=clocks.wall)
    repo.create_tenant(TenantSpec("acme"), actor="t")
    yield repo
    db.dispose()


def test_an_unavailable_database_fails_closed_with_503(broken: BrokenRepo, clocks: Clocks) -> None:
    auth = Authenticator(broken, AuthSettings(), timer=clocks.timer)
    cached = broken.issue_key("acme", KeySpec(), actor="t")
    uncached = broken.issue_key("acme", KeySpec(), actor="t")
    auth.authenticate(_bearer(cached.key), ADDR)
    broken.broken = True
    for key in (uncached.key, generate_key().key):  # a valid key and an unknown one alike
        with pytest.raises(DatabaseUnavailableError) as info:
            asyncio.run(auth.authenticate_async(_bearer(key), ADDR))
        assert info.value.status_code == 503 and info.value.headers["Retry-After"] == "1"
        assert info.value.body()["error"]["code"] == "database_unavailable"
    assert auth.authenticate(_bearer(cached.key), ADDR).tenant_id == "acme"  # served from the cache
    with pytest.raises(AuthenticationError):  # no key at all needs no database: still 401
        auth.authenticate(None, ADDR)
    broken.broken = False
    assert auth.authenticate(_bearer(uncached.key), ADDR).tenant_id == "acme"


def test_an_unavailable_database_gives_503_for_the_stored_admin_token(
    broken: BrokenRepo, clocks: Clocks
) -> None:
    token = generate_admin_token()
    broken.store_admin_token(token, actor="t", replace=False)
    admin = AdminAuthenticator(broken, None, timer=clocks.timer)
    broken.broken = True
    with pytest.raises(DatabaseUnavailableError):
        admin.authenticate(_bearer(token), ADDR)
    broken.broken = False
    admin.authenticate(_bearer(token), ADDR)


def test_the_lookup_waits_at_most_its_timeout_on_a_locked_database(
    repo: CountingRepo, clocks: Clocks
) -> None:
    """A writer holding the database does not block an uncached key for the 5 s busy timeout."""
    auth = Authenticator(repo, AuthSettings(touch_timeout_s=0.05), timer=clocks.timer)
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    locker = sqlite3.connect(repo.db.url.database or "", isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")  # WAL: readers go on, writers wait
        ctx = auth.authenticate(_bearer(issued.key), ADDR)  # the read works; touching is skipped
        assert ctx.tenant_id == "acme"
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert repo.get_key(issued.view.id).last_used_at is None  # the best-effort write gave up
