"""Tenant key and admin token authentication: sameness of refusals, cache, throttle, admin token.

The revocation race and the database unavailable are in test_auth_failures.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.auth_doubles import (
    ACME,
    ADDR,
    GLOBEX,
    START,
    Clocks,
    CountingRepo,
    bearer,
    open_repo,
)
from weir.engine.request import Priority
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import AuthenticationError, PermissionDeniedError, RateLimitError
from weir.tenancy.context import QuotaLimits
from weir.tenancy.keys.keys import generate_admin_token, generate_key
from weir.tenancy.repository.records import KeyRecord, KeySpec
from weir.tenancy.store.enums import KeyScope


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def repo(tmp_path: Path, clocks: Clocks) -> Iterator[CountingRepo]:
    with open_repo(CountingRepo, tmp_path / "weir.db", clocks, ACME, GLOBEX) as repo:
        yield repo


@pytest.fixture
def auth(repo: CountingRepo, clocks: Clocks) -> Authenticator:
    return Authenticator(
        repo,
        AuthSettings(cache_ttl_s=30, max_failures=5, max_address_failures=12, failure_window_s=60),
        timer=clocks.timer,
    )


def test_valid_key_gives_the_tenant_context(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    ctx = auth.authenticate(bearer(issued.key), ADDR)
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
        bearer("sk-not-a-weir-key"),  # malformed
        bearer(generate_key().key),  # unknown
        bearer(revoked.key),
        bearer(expiring.key),
        bearer(wrong_secret),
        bearer(generate_admin_token()),  # the admin token is not a tenant key
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
    auth.authenticate(bearer(issued.key), ADDR)
    repo.suspend_tenant("acme", actor="t")
    auth.invalidate_tenant("acme")
    with pytest.raises(PermissionDeniedError) as info:
        auth.authenticate(bearer(issued.key), ADDR)
    assert info.value.status_code == 403


def test_scope_is_enforced(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("acme", KeySpec(scopes=(KeyScope.INFERENCE,)), actor="t")
    auth.authenticate(bearer(issued.key), ADDR, scope=KeyScope.INFERENCE)
    with pytest.raises(PermissionDeniedError):
        auth.authenticate(bearer(issued.key), ADDR, scope=KeyScope.USAGE)


def test_cache_keeps_lookups_off_the_database(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    for _ in range(50):
        auth.authenticate(bearer(issued.key), ADDR)
    assert repo.lookups == 1
    assert repo.get_key(issued.view.id).last_used_at == START  # written on the miss
    clocks.advance(31)  # past the TTL: one more lookup
    auth.authenticate(bearer(issued.key), ADDR)
    assert repo.lookups == 2


def test_revocation_invalidates_locally_at_once_and_elsewhere_within_the_ttl(
    repo: CountingRepo, clocks: Clocks
) -> None:
    here = Authenticator(repo, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
    other_replica = Authenticator(repo, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
    issued = repo.issue_key("acme", KeySpec(), actor="t")
    here.authenticate(bearer(issued.key), ADDR)
    other_replica.authenticate(bearer(issued.key), ADDR)
    repo.revoke_key(issued.view.id, actor="t")
    here.invalidate(issued.view.id)  # what the admin route does
    with pytest.raises(AuthenticationError):
        here.authenticate(bearer(issued.key), ADDR)
    other_replica.authenticate(bearer(issued.key), ADDR)  # still cached: the documented window
    clocks.advance(30)
    with pytest.raises(AuthenticationError):
        other_replica.authenticate(bearer(issued.key), ADDR)


def test_expiry_applies_even_to_a_cached_key(repo: CountingRepo, auth: Authenticator, clocks: Clocks) -> None:
    issued = repo.issue_key("acme", KeySpec(expires_at=START + dt.timedelta(seconds=5)), actor="t")
    auth.authenticate(bearer(issued.key), ADDR)
    clocks.advance(5)
    with pytest.raises(AuthenticationError):
        auth.authenticate(bearer(issued.key), ADDR)


def test_a_valid_key_is_never_refused_because_of_other_clients_failures(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    """Defect 3: a load tool started without its key locked out every tenant on the machine."""
    cached = repo.issue_key("acme", KeySpec(), actor="t")
    uncached = repo.issue_key("globex", KeySpec(), actor="t")
    auth.authenticate(bearer(cached.key), ADDR)
    answers = []
    for i in range(30):  # past both the per-key and the per-address bar
        header = None if i % 2 else bearer(generate_key().key)
        with pytest.raises((AuthenticationError, RateLimitError)) as info:
            auth.authenticate(header, ADDR)
        answers.append(info.value.status_code)
    assert answers[:12] == [401] * 12 and set(answers[12:]) == {429}  # the address bar is 12
    assert auth.authenticate(bearer(cached.key), ADDR).tenant_id == "acme"
    assert auth.authenticate(bearer(uncached.key), ADDR).tenant_id == "globex"
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
            auth.authenticate(bearer(wrong), f"10.9.0.{i}")
        answers.append(info.value.status_code)
    assert answers == [401] * 5 + [429] * 2  # max_failures = 5 per key id
    assert auth.authenticate(bearer(issued.key), "10.9.0.1").key_id == issued.view.id
    with pytest.raises(AuthenticationError):  # another id from the same address: its own count
        auth.authenticate(bearer(generate_key().key), "10.9.0.1")


def test_an_unknown_id_is_looked_up_once_per_ttl(
    repo: CountingRepo, auth: Authenticator, clocks: Clocks
) -> None:
    unknown = generate_key().key
    for i in range(4):
        with pytest.raises(AuthenticationError):
            auth.authenticate(bearer(unknown), f"10.8.0.{i}")
    assert repo.lookups == 1
    clocks.advance(31)
    with pytest.raises(AuthenticationError):
        auth.authenticate(bearer(unknown), ADDR)
    assert repo.lookups == 2


def test_a_flood_of_random_key_ids_costs_no_query_each(repo: CountingRepo, clocks: Clocks) -> None:
    """Issue 21: 200 connections each sending a new random key id cost a database lookup each."""
    auth = Authenticator(
        repo,
        AuthSettings(max_unknown_lookups=5, max_total_unknown_lookups=8, max_address_failures=10_000),
        timer=clocks.timer,
    )
    uncached = repo.issue_key("globex", KeySpec(), actor="t")
    for _ in range(100):
        with pytest.raises(AuthenticationError):
            asyncio.run(auth.authenticate_async(bearer(generate_key().key), ADDR))
    # Five lookups, then every further id answered from the set of stored ids, read once.
    assert (repo.lookups, repo.id_scans) == (5, 1)
    # A valid key the cache does not hold, from the flooding address, is still served.
    assert auth.authenticate(bearer(uncached.key), ADDR).tenant_id == "globex"
    assert repo.lookups == 6
    # Other addresses: their own lookups, until all together reach the total bound.
    for i in range(10):
        with pytest.raises(AuthenticationError):
            auth.authenticate(bearer(generate_key().key), f"10.7.0.{i}")
    assert repo.lookups == 6 + 3
    clocks.advance(1)  # the set of stored ids is re-read at most once per known_ids_refresh_s
    for _ in range(50):
        with pytest.raises(AuthenticationError):
            auth.authenticate(bearer(generate_key().key), ADDR)
    assert (repo.lookups, repo.id_scans) == (9, 2)
    clocks.advance(60)  # the window is over: ids are looked up one by one again
    with pytest.raises(AuthenticationError):
        auth.authenticate(bearer(generate_key().key), ADDR)
    assert repo.lookups == 10


def test_async_variant(repo: CountingRepo, auth: Authenticator) -> None:
    issued = repo.issue_key("globex", KeySpec(), actor="t")
    ctx = asyncio.run(auth.authenticate_async(bearer(issued.key), ADDR))
    assert ctx.tenant_id == "globex"
    again = asyncio.run(auth.authenticate_async(bearer(issued.key), ADDR))
    assert again == ctx and repo.lookups == 1
    with pytest.raises(AuthenticationError):
        asyncio.run(auth.authenticate_async(None, ADDR))


class GatedRepo(CountingRepo):
    """Lookups wait for `gate` (on the worker thread) and touches are counted."""

    touches = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        self.gate.wait(30)  # a hang guard; the test opens it
        return super().lookup_key(key_id, timeout_s=timeout_s)

    def touch_key(self, key_id: str, when: dt.datetime, *, timeout_s: float | None = None) -> None:
        self.touches += 1
        super().touch_key(key_id, when, timeout_s=timeout_s)


def test_a_burst_with_an_uncached_key_sends_one_lookup_and_one_touch(tmp_path: Path, clocks: Clocks) -> None:
    with open_repo(GatedRepo, tmp_path / "weir.db", clocks, ACME) as repo:
        auth = Authenticator(repo, AuthSettings(cache_ttl_s=30), timer=clocks.timer)
        issued = repo.issue_key("acme", KeySpec(), actor="t")
        wrong = issued.key[:-4] + ("aaaa" if not issued.key.endswith("aaaa") else "bbbb")

        async def main() -> list[object]:
            calls = [auth.authenticate_async(bearer(issued.key), ADDR) for _ in range(30)]
            calls.append(auth.authenticate_async(bearer(wrong), ADDR))  # same id, wrong secret
            tasks = [asyncio.ensure_future(c) for c in calls]
            for _ in range(5):
                await asyncio.sleep(0)  # every request reaches the lookup in flight
            repo.gate.set()
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = asyncio.run(main())
        assert repo.lookups == 1 and repo.touches == 1
        assert all(getattr(r, "tenant_id", None) == "acme" for r in results[:-1])
        assert isinstance(results[-1], AuthenticationError)  # its own secret is still checked
