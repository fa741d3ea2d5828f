"""The admin console on a minimal app over a real repository (SQLite), for the console's tests:
`Console` (a TestClient that logs in and posts forms) and its `make_console` context."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.gateway.fleet.test_model_fleet import MIB, Factory
from tests.tenancy.clock import FakeClock
from weir.engine.engine_stats import EngineStats
from weir.engine.kv.memory_budget import MemoryBudget
from weir.gateway.console.routes import ConsoleDeps, console_routes
from weir.gateway.console.sessions import SessionStore
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import exception_handlers
from weir.gateway.http.failure_throttle import FailureThrottle
from weir.migrations.migrate import upgrade
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

TOKEN = "console-admin-token-0123456789"
UI = "/admin/ui"
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'
MAX_LOGIN_FAILURES = 3
STATS = EngineStats(num_running=2, num_waiting=5, num_total_blocks=100, num_free_blocks=25, block_size=16)


@dataclass
class Console:
    client: TestClient
    repo: TenancyRepo
    rollout: ModelRollout
    sessions: SessionStore

    def login_form(self) -> str:
        """GET the login form; its CSRF token (the login cookie is now set)."""
        page = self.client.get(f"{UI}/login")
        assert page.status_code == 200
        return csrf_of(page.text)

    def login(self, token: str = TOKEN) -> str:
        """Log in; the CSRF token of the session's pages."""
        answer = self.client.post(
            f"{UI}/login", data={"token": token, "csrf_token": self.login_form()}, follow_redirects=False
        )
        assert answer.status_code == 303, answer.text
        return csrf_of(self.client.get(f"{UI}/tenants").text)

    def post(self, path: str, csrf: str | None, /, **fields: str) -> object:
        data = dict(fields)
        if csrf is not None:
            data["csrf_token"] = csrf
        return self.client.post(f"{UI}{path}", data=data, follow_redirects=False)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match is not None, html
    return match.group(1)


def _app(deps: ConsoleDeps) -> Starlette:
    return Starlette(routes=console_routes(deps), exception_handlers=exception_handlers())


@contextlib.contextmanager
def make_console(tmp_path: Path) -> Iterator[Console]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"pepper"), clock=FakeClock())
    authenticator = Authenticator(repo, AuthSettings())
    throttle = FailureThrottle(MAX_LOGIN_FAILURES, window_s=3600)
    admin_auth = AdminAuthenticator(repo, TOKEN, throttle=throttle)
    rollout = ModelRollout(ModelFleet(Factory(), MemoryBudget(8 * MIB)), ModelVersionRepo(db))
    sessions = SessionStore()
    deps = ConsoleDeps(repo, authenticator, admin_auth, lambda: {"m@v1": STATS}, rollout, sessions)
    with TestClient(_app(deps)) as client:
        yield Console(client, repo, rollout, sessions)
    db.dispose()
