"""gateway/http/admin_auth.py: the admin token, stored or configured, and its failure throttle."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.auth_doubles import ACME, ADDR, GLOBEX, Clocks, CountingRepo, bearer, open_repo
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import AuthenticationError, RateLimitError
from weir.gateway.http.failure_throttle import FailureThrottle
from weir.tenancy.keys.keys import generate_admin_token
from weir.tenancy.repository.records import KeySpec


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def repo(tmp_path: Path, clocks: Clocks) -> Iterator[CountingRepo]:
    with open_repo(CountingRepo, tmp_path / "weir.db", clocks, ACME, GLOBEX) as repo:
        yield repo


def test_admin_token_stored_hash(repo: CountingRepo, clocks: Clocks) -> None:
    admin = AdminAuthenticator(repo, None, timer=clocks.timer)
    token = generate_admin_token()
    with pytest.raises(AuthenticationError):  # nothing stored yet: admin API closed
        admin.authenticate(bearer(token), ADDR)
    repo.store_admin_token(token, actor="t", replace=False)
    admin.invalidate()
    admin.authenticate(bearer(token), ADDR)
    tenant_key = repo.issue_key("acme", KeySpec(), actor="t").key
    for header in (None, bearer(tenant_key), bearer(token + "x"), token):
        with pytest.raises(AuthenticationError) as info:
            admin.authenticate(header, "10.1.1.1")
        assert info.value.status_code == 401


def test_configured_admin_token_wins(repo: CountingRepo, clocks: Clocks) -> None:
    stored = generate_admin_token()
    repo.store_admin_token(stored, actor="t", replace=False)
    admin = AdminAuthenticator(repo, "operator-chosen-token-0123456789", timer=clocks.timer)
    admin.authenticate(bearer("operator-chosen-token-0123456789"), ADDR)
    asyncio.run(admin.authenticate_async(bearer("operator-chosen-token-0123456789"), ADDR))
    with pytest.raises(AuthenticationError):
        admin.authenticate(bearer(stored), ADDR)


def test_admin_failures_are_throttled_but_never_the_token(repo: CountingRepo, clocks: Clocks) -> None:
    throttle = FailureThrottle(3, 60, timer=clocks.timer)
    admin = AdminAuthenticator(
        repo, "operator-chosen-token-0123456789", throttle=throttle, timer=clocks.timer
    )
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            admin.authenticate(bearer("guess"), ADDR)
    with pytest.raises(RateLimitError):
        admin.authenticate(bearer("guess"), ADDR)
    admin.authenticate(bearer("operator-chosen-token-0123456789"), ADDR)  # the real token passes
