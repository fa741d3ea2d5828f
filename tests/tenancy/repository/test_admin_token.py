"""First-start admin token."""

from __future__ import annotations

from weir.tenancy.keys.keys import ADMIN_TOKEN_PREFIX, parse_key
from weir.tenancy.repository.admin_token import admin_token_banner, ensure_admin_token, reset_admin_token
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import AuditAction


def test_generated_once_and_only_its_hash_stored(repo: TenancyRepo) -> None:
    token = ensure_admin_token(repo, None)
    assert token is not None and token.startswith(ADMIN_TOKEN_PREFIX)
    assert parse_key(token) is None  # cannot be used as a tenant key
    stored = repo.admin_token_hash()
    assert stored == repo.hasher.hash(token) and token not in stored
    assert ensure_admin_token(repo, None) is None  # second start: nothing new, nothing shown
    assert repo.admin_token_hash() == stored
    assert [e.action for e in repo.list_audit()] == [AuditAction.ADMIN_TOKEN_SET]


def test_configured_token_means_nothing_is_generated(repo: TenancyRepo) -> None:
    assert ensure_admin_token(repo, "weir-admin-configured-by-the-operator") is None
    assert repo.admin_token_hash() is None


def test_reset_replaces_the_stored_token(repo: TenancyRepo) -> None:
    first = ensure_admin_token(repo, None)
    second = reset_admin_token(repo, actor="cli")
    assert first is not None and second != first
    assert repo.admin_token_hash() == repo.hasher.hash(second)


def test_banner_shows_the_token() -> None:
    assert "weir-admin-abc" in admin_token_banner("weir-admin-abc")
