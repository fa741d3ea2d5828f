"""`weir admin`, against the database and against a server (same output)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.routes.admin import admin_routes
from weir.migrations import cli  # the `db` and `admin` commands together
from weir.migrations.migrate import upgrade
from weir.tenancy.cli.admin_client import HttpAdmin
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

ADMIN_TOKEN = "weir-admin-cli-test-token-0123456789"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpAdmin]:
    """A minimal app with the admin routes, over the same kind of database."""
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"pepper"))
    app = Starlette(routes=admin_routes(repo, Authenticator(repo), AdminAuthenticator(repo, ADMIN_TOKEN)))
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        yield HttpAdmin(client)
    db.dispose()


@pytest.fixture(params=["direct", "http"])
def where(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> list[str]:
    """Command-line options selecting the backend; the HTTP one is routed to the in-process app."""
    if request.param == "direct":
        data = str(tmp_path / "direct")
        assert run(capsys, "db", "upgrade", "--data-dir", data)[0] == 0
        return ["--data-dir", data]
    backend = request.getfixturevalue("server")
    monkeypatch.setattr(HttpAdmin, "connect", classmethod(lambda cls, url, token, **kw: backend))
    monkeypatch.setattr(HttpAdmin, "close", lambda self: None)
    return ["--server", "http://weir.test", "--admin-token", ADMIN_TOKEN]


def test_admin_operations(where: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def admin(*argv: str) -> dict:
        code, out, err = run(capsys, "admin", *argv, *where)
        assert code == 0, err
        return json.loads(out)

    created = admin("tenants", "create", "acme", "--priority", "interactive", "--weight", "2",
                    "--tokens-per-minute", "2000000", "--max-concurrent", "64", "--model", "a", "--model", "b")  # fmt: skip
    assert created["priority"] == "interactive" and created["quota"]["models"] == ["a", "b"]
    assert [t["name"] for t in admin("tenants", "list")["data"]] == ["acme"]
    assert admin("tenants", "get", "acme")["weight"] == 2.0
    assert admin("tenants", "update", "acme", "--priority", "batch")["priority"] == "batch"
    quota = admin("quota", "set", "acme", "--tokens-per-day", "1000", "--ttft-slo-ms", "500")["quota"]
    assert (quota["tokens_per_day"], quota["ttft_slo_ms"], quota["tokens_per_minute"]) == (1000, 500, None)
    key = admin("keys", "issue", "acme", "--scope", "usage", "--expires-in-days", "30")
    assert key["key"].startswith("sk-weir-") and key["scopes"] == ["usage"] and key["expires_at"]
    listed = admin("keys", "list", "acme")["data"]
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]
    rotated = admin("keys", "rotate", key["id"])
    assert rotated["id"] != key["id"]
    assert admin("keys", "revoke", rotated["id"])["state"] == "revoked"
    assert admin("usage", "daily", "acme", "--since", "2020-01-01")["data"] == []
    report = admin("usage", "report", "--since", "2020-01-01", "--until", "2030-01-01T00:00:00Z",
                   "--group-by", "tenant,key,hour", "--tenant", "acme", "--limit", "5")  # fmt: skip
    assert (report["data"], report["totals"]["requests"], report["group_by"]) == (
        [],
        0,
        ["tenant", "key", "hour"],
    )
    code, out, err = run(capsys, "admin", "usage", "report", "--since", "2020-01-01", "--until", "2030-01-01",
                         "--group-by", "user,day", "--format", "csv", *where)  # fmt: skip
    assert code == 0 and out.splitlines()[0].startswith("user,day,requests,"), err
    code, _, err = run(
        capsys, "admin", "usage", "report", "--since", "2020-01-01", "--until", "2019-01-01", *where
    )
    assert code == 1 and "until" in err
    assert admin("tenants", "suspend", "acme")["status"] == "suspended"
    actions = [e["action"] for e in admin("audit", "--tenant", "acme", "--limit", "50")["data"]]
    assert actions == ["tenant.suspend", "key.revoke", "key.rotate", "key.issue", "quota.set",
                       "tenant.update", "tenant.create"]  # fmt: skip


def test_admin_errors(where: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "admin", "tenants", "get", "nobody", *where)
    assert code == 1 and "nobody" in err
    code, _, err = run(capsys, "admin", "tenants", "create", "acme", "--max-concurrent", "0", *where)
    assert code == 1 and "max_concurrent" in err


def test_sharing_a_cache_scope_from_the_cli(where: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def admin(*argv: str) -> tuple[int, str, str]:
        return run(capsys, "admin", *argv, *where)

    assert admin("tenants", "create", "tb")[0] == 0
    code, _, err = admin("tenants", "create", "ok2", "--cache-scope", "tb")
    assert code == 1 and "share_cache_scope_with" in err  # refused, and told how to share
    code, out, err = admin("tenants", "create", "ok2", "--share-cache-scope-with", "tb")
    assert code == 0, err
    assert json.loads(out)["cache_scope"] == "tb"
    assert admin("tenants", "create", "tc")[0] == 0
    code, out, err = admin("tenants", "update", "tc", "--share-cache-scope-with", "tb")
    assert code == 0, err
    assert json.loads(out)["cache_scope"] == "tb"
    code, out, _ = admin("audit", "--tenant", "tc", "--limit", "1")
    assert json.loads(out)["data"][0]["details"]["share_cache_scope_with"] == "tb"


def test_server_needs_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "admin", "tenants", "list", "--server", "http://127.0.0.1:9")
    assert code == 2 and "--admin-token" in err


class FakeSettings:
    """Stands in for weir.gateway.settings.settings.Settings."""

    def __init__(self, url: str) -> None:
        self.resolved_database_url = url
        self.key_pepper = "pepper"
        self.admin_token = None


def test_settings_factory_supplies_database_and_pepper(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'from-settings.db'}"
    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers(dest="command", required=True), lambda args: FakeSettings(url))

    def weir(*argv: str) -> int:
        args = parser.parse_args(argv)
        return int(args.func(args))

    assert weir("db", "upgrade") == 0
    assert weir("admin", "tenants", "create", "acme") == 0
    assert weir("admin", "keys", "issue", "acme") == 0
    key = json.loads(capsys.readouterr().out.split("\n}\n", 1)[1])["key"]
    assert weir("admin", "token", "reset") == 0
    token = capsys.readouterr().out.strip()
    db = Database(url)
    repo = TenancyRepo(db, KeyHasher(b"pepper"))
    record = repo.lookup_key(key.split("-")[2])
    assert record is not None and repo.hasher.verify(key, record.secret_hash)  # hashed with the pepper
    assert repo.admin_token_hash() == repo.hasher.hash(token)
    db.dispose()
