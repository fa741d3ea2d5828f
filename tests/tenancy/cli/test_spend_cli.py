"""`weir admin prices|budgets ...` against the database and against a server (the same JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import exception_handlers
from weir.gateway.routes.spend_admin import spend_admin_routes
from weir.migrations import cli  # the `db` and `admin` commands together
from weir.tenancy.cli.admin_client import HttpAdmin
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database, sqlite_url_for
from weir.tenancy.store.enums import AuditAction

TOKEN = "weir-admin-cli-test-token-0123456789"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Where:
    def __init__(self, options: list[str], repo: TenancyRepo, key_id: str) -> None:
        self.options, self.repo, self.key_id = options, repo, key_id


@pytest.fixture(params=["direct", "http"])
def where(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Where]:
    data = tmp_path / request.param
    assert run(capsys, "db", "upgrade", "--data-dir", str(data))[0] == 0
    db = Database(sqlite_url_for(data))
    repo = TenancyRepo(db, KeyHasher(b"pepper"))
    repo.create_tenant(TenantSpec("acme"), actor="test")
    key_id = repo.issue_key("acme", KeySpec(), actor="test").view.id
    if request.param == "direct":
        yield Where(["--data-dir", str(data)], repo, key_id)
    else:
        app = Starlette(
            routes=spend_admin_routes(db, AdminAuthenticator(repo, TOKEN)),
            exception_handlers=exception_handlers(),  # type: ignore[arg-type]
        )
        with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            backend = HttpAdmin(client)  # type: ignore[arg-type]
            monkeypatch.setattr(HttpAdmin, "connect", classmethod(lambda cls, url, token, **kw: backend))
            monkeypatch.setattr(HttpAdmin, "close", lambda self: None)
            yield Where(["--server", "http://weir.test", "--admin-token", TOKEN], repo, key_id)
    db.dispose()


def _admin(capsys: pytest.CaptureFixture[str], where: Where) -> Callable[..., Any]:
    def admin(*argv: str, ok: bool = True) -> Any:
        code, out, err = run(capsys, "admin", *argv, *where.options)
        if not ok:
            assert code != 0 and out == "", out
            return err
        assert code == 0, err
        return json.loads(out)

    return admin


def test_prices_and_budgets(where: Where, capsys: pytest.CaptureFixture[str]) -> None:
    admin = _admin(capsys, where)
    price = admin("prices", "set", "smol@v1", "--input", "0.15", "--cached-input", "0.075", "--output", "0.6")
    assert (price["input_micros_per_million"], price["cached_input_micros_per_million"]) == (150_000, 75_000)
    assert price["output_per_million"] == "0.600000" and price["currency"] == "USD"
    later = admin("prices", "set", "smol@v1", "--input", "0.2", "--output", "0.8",
                  "--effective-from", "2099-01-01T00:00:00Z")  # fmt: skip
    assert later["effective_from"] == "2099-01-01T00:00:00Z"
    assert [p["id"] for p in admin("prices", "list", "--model", "smol@v1")["data"]] == [
        price["id"],
        later["id"],
    ]
    assert "input_per_million" in admin(
        "prices", "set", "smol", "--input", "0.1234567", "--output", "1", ok=False
    )
    assert "past" in admin("prices", "set", "smol", "--input", "1", "--output", "1",
                           "--effective-from", "2000-01-01T00:00:00Z", ok=False)  # fmt: skip
    assert "currency" in admin(
        "prices", "set", "smol", "--currency", "EUR", "--input", "1", "--output", "1", ok=False
    )

    budget = admin("budgets", "set", "acme", "--key", where.key_id, "--unit", "tokens", "--window", "month",
                   "--time-zone", "America/New_York", "--soft", "800", "--hard", "1000")  # fmt: skip
    assert (budget["window"], budget["time_zone"], budget["used"]) == ("month", "America/New_York", 0)
    assert budget["resets_at"].endswith(("T04:00:00Z", "T05:00:00Z"))  # local midnight of the 1st
    rolling = admin("budgets", "set", "acme", "--unit", "micros", "--window", "rolling", "--rolling-s", "3600",
                    "--hard", "5000000")  # fmt: skip
    assert rolling["rolling_s"] == 3600 and rolling["key_id"] is None
    assert len(admin("budgets", "list", "--tenant", "acme")["data"]) == 2
    assert "rolling_s" in admin("budgets", "set", "acme", "--unit", "tokens", "--window", "rolling",
                                "--rolling-s", "61", "--hard", "5", ok=False)  # fmt: skip
    assert "time_zone" in admin("budgets", "set", "acme", "--unit", "tokens", "--window", "day",
                                "--time-zone", "Atlantis/Capital", "--hard", "5", ok=False)  # fmt: skip
    assert "soft_limit" in admin("budgets", "set", "acme", "--unit", "tokens", "--window", "day",
                                 "--soft", "9", "--hard", "5", ok=False)  # fmt: skip
    assert "not found" in admin("budgets", "set", "nobody", "--unit", "tokens", "--window", "day", "--hard", "5",
                                ok=False)  # fmt: skip
    assert admin("budgets", "delete", str(rolling["id"]))["id"] == rolling["id"]
    assert "not found" in admin("budgets", "delete", str(rolling["id"]), ok=False)
    actions = [e.action for e in where.repo.list_audit(limit=10)]
    assert actions[:4] == [AuditAction.BUDGET_DELETE, AuditAction.BUDGET_SET, AuditAction.BUDGET_SET,
                           AuditAction.PRICE_SET]  # fmt: skip
