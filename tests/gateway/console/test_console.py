"""The admin console on a minimal app over a real repository (SQLite): login and its cookie,
CSRF refusals, tenant keys refused, the pages and actions, hostile names rendered inert."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from engine.memory_budget import MemoryBudget
from engine.output import EngineStats
from gateway.auth import AdminAuthenticator, Authenticator, AuthSettings, FailureThrottle
from gateway.console.routes import LOGIN_COOKIE, SESSION_COOKIE, ConsoleDeps, console_routes
from gateway.console.sessions import SessionStore
from gateway.errors import exception_handlers
from gateway.model_fleet import ModelFleet
from gateway.model_rollout import ModelRollout
from tenancy.db import Database
from tenancy.enums import UsageStatus
from tenancy.keys import KEY_PREFIX, KeyHasher
from tenancy.migrate import upgrade
from tenancy.model_version_records import ModelVersionSpec
from tenancy.model_versions import ModelVersionRepo
from tenancy.records import KeySpec, TenantSpec, UsageRecordIn
from tenancy.repo import TenancyRepo
from tests.gateway.test_model_fleet import MIB, Factory
from tests.tenancy.clock import START, FakeClock

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
        return _csrf(page.text)

    def login(self, token: str = TOKEN) -> str:
        """Log in; the CSRF token of the session's pages."""
        answer = self.client.post(
            f"{UI}/login", data={"token": token, "csrf_token": self.login_form()}, follow_redirects=False
        )
        assert answer.status_code == 303, answer.text
        return _csrf(self.client.get(f"{UI}/tenants").text)

    def post(self, path: str, csrf: str | None, /, **fields: str) -> object:
        data = dict(fields)
        if csrf is not None:
            data["csrf_token"] = csrf
        return self.client.post(f"{UI}{path}", data=data, follow_redirects=False)


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match is not None, html
    return match.group(1)


def _app(deps: ConsoleDeps) -> Starlette:
    return Starlette(routes=console_routes(deps), exception_handlers=exception_handlers())


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
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


# -- login, cookie, logout --------------------------------------------------------------------------


def test_login_sets_a_strict_httponly_session_cookie_and_logout_ends_it(console: Console) -> None:
    answer = console.client.post(
        f"{UI}/login", data={"token": TOKEN, "csrf_token": console.login_form()}, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"] == f"{UI}/tenants"
    cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", f"path={UI}"} <= flags
    assert "secure" not in flags  # plain http here; see the https test
    assert TOKEN not in cookie and TOKEN not in answer.headers["location"]
    page = console.client.get(f"{UI}/tenants")
    assert page.status_code == 200 and "Log out" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    csrf = _csrf(page.text)
    assert console.post("/logout", csrf).status_code == 303  # type: ignore[attr-defined]
    assert console.sessions.num_sessions == 0
    assert console.client.get(f"{UI}/tenants", follow_redirects=False).status_code == 303


def test_the_session_cookie_is_secure_over_https(console: Console) -> None:
    client = TestClient(console.client.app, base_url="https://testserver")
    form = client.get(f"{UI}/login")
    assert "secure" in form.headers["set-cookie"].lower()
    csrf = _csrf(form.text)
    answer = client.post(f"{UI}/login", data={"token": TOKEN, "csrf_token": csrf}, follow_redirects=False)
    cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
    assert "secure" in {p.strip().lower() for p in cookie.split(";")}


def test_a_session_expires() -> None:
    now = [0.0]
    sessions = SessionStore(ttl_s=60, timer=lambda: now[0])
    session = sessions.create()
    assert sessions.get(session.session_id) == session
    now[0] = 61.0
    assert sessions.get(session.session_id) is None
    assert "redacted" in repr(session) and session.csrf_token not in repr(session)


def test_a_wrong_token_is_refused_in_place_then_throttled(console: Console) -> None:
    for _ in range(MAX_LOGIN_FAILURES):
        answer = console.client.post(
            f"{UI}/login", data={"token": "wrong", "csrf_token": console.login_form()}
        )
        assert answer.status_code == 401 and 'role="alert"' in answer.text
    blocked = console.client.post(f"{UI}/login", data={"token": "wrong", "csrf_token": console.login_form()})
    assert blocked.status_code == 429 and "retry-after" in blocked.headers
    # The right token is never refused by the throttle (it counts failures only).
    assert (
        console.client.post(
            f"{UI}/login", data={"token": TOKEN, "csrf_token": console.login_form()}, follow_redirects=False
        ).status_code
        == 303
    )


def test_login_without_its_csrf_cookie_or_field_is_refused(console: Console) -> None:
    token = console.login_form()
    assert console.client.post(f"{UI}/login", data={"token": TOKEN}).status_code == 403
    assert (
        console.client.post(f"{UI}/login", data={"token": TOKEN, "csrf_token": token + "x"}).status_code
        == 403
    )
    console.client.cookies.delete(LOGIN_COOKIE, path=UI)
    assert console.client.post(f"{UI}/login", data={"token": TOKEN, "csrf_token": token}).status_code == 403
    assert console.sessions.num_sessions == 0


def test_a_tenant_key_reaches_no_console_page_or_action(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    key = console.repo.issue_key("acme", KeySpec(), actor="test").key
    bearer = {"Authorization": f"Bearer {key}"}
    for path in ("/", "/tenants", "/tenants/acme", "/engine", "/audit", "/usage", "/usage.csv", "/models"):
        answer = console.client.get(f"{UI}{path}", headers=bearer, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == f"{UI}/login", path
    assert console.client.get(f"{UI}/engine.json", headers=bearer).status_code == 401
    assert console.client.post(f"{UI}/tenants", data={"name": "x"}, headers=bearer).status_code == 403
    # Nor can it log in.
    answer = console.client.post(f"{UI}/login", data={"token": key, "csrf_token": console.login_form()})
    assert answer.status_code == 401 and console.sessions.num_sessions == 0


# -- CSRF -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/tenants",
        "/tenants/acme",
        "/tenants/acme/quota",
        "/tenants/acme/suspend",
        "/tenants/acme/keys",
        "/models",
        "/models/m/versions",
        "/models/m/traffic",
        "/models/m/pins",
        "/models/m/rollback",
        "/logout",
    ],  # fmt: skip
)
def test_every_action_refuses_a_missing_or_wrong_csrf_token(console: Console, path: str) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    csrf = console.login()
    before = console.repo.list_audit()
    for token in (None, "", csrf[:-1] + ("A" if csrf[-1] != "A" else "B")):
        answer = console.post(path, token, name="evil", confirm="yes", priority="batch")
        assert answer.status_code == 403, (path, token)  # type: ignore[attr-defined]
    assert console.repo.list_audit() == before  # nothing changed
    assert console.sessions.num_sessions == 1  # not even a logout


# -- pages and actions ------------------------------------------------------------------------------


def test_create_edit_issue_revoke_and_suspend(console: Console) -> None:
    csrf = console.login()
    created = console.post("/tenants", csrf, name="acme", priority="interactive", weight="2")
    assert created.status_code == 303 and created.headers["location"] == f"{UI}/tenants/acme"  # type: ignore[attr-defined]
    listed = console.client.get(f"{UI}/tenants", params={"q": "ac"})
    assert ">acme</a>" in listed.text
    assert ">acme</a>" not in console.client.get(f"{UI}/tenants", params={"q": "zzz"}).text

    assert console.post("/tenants/acme", csrf, priority="batch", weight="3").status_code == 200  # type: ignore[attr-defined]
    quota = console.post(
        "/tenants/acme/quota", csrf, tokens_per_minute="1000", max_concurrent="", models="m, n"
    )
    assert quota.status_code == 200  # type: ignore[attr-defined]
    tenant = console.repo.get_tenant("acme")
    assert (tenant.priority.name, tenant.weight, tenant.quota.tokens_per_minute) == ("BATCH", 3.0, 1000)
    assert tenant.quota.models == ("m", "n") and tenant.quota.max_concurrent is None

    issued = console.post("/tenants/acme/keys", csrf, scope_inference="on")
    assert issued.status_code == 201  # type: ignore[attr-defined]
    (key,) = console.repo.list_keys("acme")
    secret = re.search(r'id="new-key" readonly value="([^"]+)"', issued.text)  # type: ignore[attr-defined]
    assert secret is not None and secret.group(1).startswith(f"{KEY_PREFIX}{key.id}-")
    page = console.client.get(f"{UI}/tenants/acme").text
    assert key.id in page and secret.group(1) not in page  # shown once
    assert [s.value for s in key.scopes] == ["inference"]

    revoked = console.post(f"/keys/{key.id}/revoke", csrf)
    assert revoked.status_code == 303 and console.repo.get_key(key.id).revoked_at is not None  # type: ignore[attr-defined]

    refused = console.post("/tenants/acme/suspend", csrf)  # no confirmation
    assert refused.status_code == 422 and console.repo.get_tenant("acme").status.value == "active"  # type: ignore[attr-defined]
    assert console.post("/tenants/acme/suspend", csrf, confirm="yes").status_code == 200  # type: ignore[attr-defined]
    assert console.repo.get_tenant("acme").status.value == "suspended"
    actors = {e.actor for e in console.repo.list_audit()}
    assert actors == {"admin-console testclient"}


def test_errors_are_shown_in_place_with_the_api_status(console: Console) -> None:
    csrf = console.login()
    console.post("/tenants", csrf, name="acme")
    dup = console.post("/tenants", csrf, name="acme")
    assert dup.status_code == 409 and 'role="alert"' in dup.text  # type: ignore[attr-defined]
    bad = console.post("/tenants/acme/quota", csrf, tokens_per_minute="lots")
    assert bad.status_code == 422 and "tokens_per_minute" in bad.text  # type: ignore[attr-defined]
    assert console.client.get(f"{UI}/tenants/nobody").status_code == 404


def test_hostile_strings_are_rendered_inert(console: Console) -> None:
    csrf = console.login()
    # Through a refused tenant name (echoed in the error), the search box and a model path.
    named = console.post("/tenants", csrf, name=HOSTILE)
    searched = console.client.get(f"{UI}/tenants", params={"q": HOSTILE})
    asyncio.run(console.rollout.register(ModelVersionSpec(name="m", version="v1", path=HOSTILE), "test"))
    models = console.client.get(f"{UI}/models")
    for page in (named.text, searched.text, models.text):  # type: ignore[attr-defined]
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_live_engine_page_and_its_json(console: Console) -> None:
    console.login()
    page = console.client.get(f"{UI}/engine").text
    assert 'data-version="m@v1"' in page and '<td data-field="waiting">5</td>' in page
    assert '<td data-field="kv_usage">75.0%</td>' in page
    data = console.client.get(f"{UI}/engine.json").json()["data"]
    assert data[0]["running"] == 2 and data[0]["host_kv_usage"] == "off"
    assert console.client.get(f"{UI}/static/console.js").headers["content-type"].startswith("text/javascript")
    assert console.client.get(f"{UI}/static/../routes.py").status_code == 404


def test_usage_table_chart_and_csv(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    for i, tokens in enumerate((10, 30)):
        console.repo.record_usage(
            UsageRecordIn(
                request_id=f"r{i}",
                tenant_id="acme",
                key_id=None,
                model="m",
                status=UsageStatus.COMPLETED,
                prompt_tokens=tokens,
                completion_tokens=0,
                created_at=START.replace(day=1 + i),
                user=HOSTILE,
            )  # fmt: skip
        )
    console.login()
    query = {"tenant": "acme", "since": "2030-01-01", "until": "2030-01-02"}
    page = console.client.get(f"{UI}/usage", params=query)
    assert page.status_code == 200
    day_chart = page.text.split('id="day-chart"')[1].split("</svg>")[0]
    assert day_chart.count("<rect ") == 2
    assert "<td>2030-01-02</td><td>1</td>" in page.text
    # Broken down by user (one group: both records carry HOSTILE), rendered as text.
    by_user = console.client.get(f"{UI}/usage", params={**query, "group_by": "user"})
    assert by_user.status_code == 200 and HOSTILE not in by_user.text
    assert "&lt;script&gt;" in by_user.text and "<td>2</td>" in by_user.text
    by_model = console.client.get(f"{UI}/usage", params={**query, "group_by": "model"})
    assert '<td class="mono">m</td><td>2</td>' in by_model.text
    unknown = console.client.get(f"{UI}/usage", params={**query, "group_by": "colour"})
    assert unknown.status_code == 422 and "group_by" in unknown.text
    csv_answer = console.client.get(f"{UI}/usage.csv", params=query)
    assert csv_answer.headers["content-type"].startswith("text/csv")
    assert "attachment" in csv_answer.headers["content-disposition"]
    assert csv_answer.text.splitlines()[1:] == [
        "acme,2030-01-01,1,1,0,0,10,0,0",
        "acme,2030-01-02,1,1,0,0,30,0,0",
    ]


def test_audit_page_filters_by_tenant(console: Console) -> None:
    csrf = console.login()
    console.post("/tenants", csrf, name="acme")
    console.post("/tenants", csrf, name="beta")
    page = console.client.get(f"{UI}/audit", params={"tenant": "beta"}).text
    assert "<td>beta</td>" in page and "<td>acme</td>" not in page


def test_traffic_needs_confirmation_and_shows_refusals_in_place(console: Console) -> None:
    asyncio.run(console.rollout.register(ModelVersionSpec(name="m", version="v1", path="ok"), "test"))
    csrf = console.login()
    unconfirmed = console.post("/models/m/traffic", csrf, **{"split.v1": "100"})
    assert unconfirmed.status_code == 422  # type: ignore[attr-defined]
    not_ready = console.post("/models/m/traffic", csrf, confirm="yes", **{"split.v1": "100"})
    assert not_ready.status_code == 409 and "only ready versions take traffic" in not_ready.text  # type: ignore[attr-defined]


def test_model_version_actions_register_load_pin_drain_rollback_retire(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    csrf = console.login()

    def post(path: str, /, **fields: str) -> Any:
        answer: Any = console.post(path, csrf, **fields)
        return answer

    for version in ("v1", "v2"):
        registered = post("/models", name="m", version=version, path="ok", kv_cache_tokens="64")
        assert registered.status_code == 200 and f"Registered m@{version}" in registered.text
    assert post("/models/m/versions", version="v1", op="load").status_code == 422  # not confirmed
    for version in ("v1", "v2"):
        loaded = post("/models/m/versions", version=version, op="load", confirm="yes")
        assert loaded.status_code == 200 and f"m@{version} is ready" in loaded.text, loaded.text
    split = post("/models/m/traffic", confirm="yes", **{"split.v1": "50", "split.v2": "50"})
    assert split.status_code == 200 and "<td>50%</td>" in split.text
    pinned = post("/models/m/pins", tenant="acme", version="v2", confirm="yes")
    assert pinned.status_code == 200 and "acme pinned to m@v2" in pinned.text
    assert asyncio.run(console.rollout.traffic("m")).pins == {"acme": "v2"}
    unknown = post("/models/m/pins", tenant="nobody", version="v2", confirm="yes")
    assert unknown.status_code == 404 and "nobody" in unknown.text
    rolled = post("/models/m/rollback", to="v1", confirm="yes")
    assert rolled.status_code == 200 and "Rolled m back to v1" in rolled.text
    plan = asyncio.run(console.rollout.traffic("m"))
    assert plan.split == {"v1": 100}
    drained = post("/models/m/versions", version="v2", op="drain", confirm="yes")
    assert drained.status_code in (200, 409), drained.text  # the rollback may have drained it already
    retired = post("/models/m/versions", version="v2", op="retire", confirm="yes")
    assert retired.status_code == 200 and "m@v2 is retired" in retired.text, retired.text
    unpinned = post("/models/m/pins", tenant="acme", version="", confirm="yes")
    assert unpinned.status_code in (200, 409), unpinned.text
    bad_op = post("/models/m/versions", version="v1", op="explode", confirm="yes")
    assert bad_op.status_code == 422 and "op" in bad_op.text
    actions = {e.action.value for e in console.repo.list_audit()}
    assert any("model" in a for a in actions), actions


def test_a_failed_load_and_hostile_model_fields_are_shown_in_place(console: Console) -> None:
    csrf = console.login()
    registered: Any = console.post("/models", csrf, name="m", version="bad", path="bad-warmup")
    assert registered.status_code == 200
    failed: Any = console.post("/models/m/versions", csrf, version="bad", op="load", confirm="yes")
    assert failed.status_code == 422 and "loading model version m@bad failed" in failed.text
    hostile: Any = console.post("/models", csrf, name=HOSTILE, version=HOSTILE, path=HOSTILE)
    assert hostile.status_code == 422 and HOSTILE not in hostile.text
    path: Any = console.post("/models", csrf, name="m", version="v9", path=HOSTILE)
    assert HOSTILE not in path.text  # registered or refused, the path shows only as text


def test_a_keys_own_limits_are_shown_and_set_within_its_tenant(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    key_id = console.repo.issue_key("acme", KeySpec(), actor="test").view.id
    csrf = console.login()
    tenant_page = console.client.get(f"{UI}/tenants/acme")
    assert f'href="{UI}/keys/{key_id}"' in tenant_page.text and "the tenant's" in tenant_page.text
    page = console.client.get(f"{UI}/keys/{key_id}")
    assert page.status_code == 200 and 'id="kl-tokens_per_minute"' in page.text
    saved: Any = console.post(f"/keys/{key_id}/limits", csrf, tokens_per_minute="500", models="m, n")
    assert saved.status_code == 200 and "Key limits saved." in saved.text
    stored = console.repo.get_key(key_id).limits
    assert stored.tokens_per_minute == 500 and stored.models == ("m", "n")
    assert "tokens per minute 500" in console.client.get(f"{UI}/tenants/acme").text
    for bad in ({"tokens_per_minute": "0"}, {"max_concurrent": "lots", "models": HOSTILE}):
        refused: Any = console.post(f"/keys/{key_id}/limits", csrf, **bad)
        assert refused.status_code in (400, 422), (bad, refused.status_code)
        assert HOSTILE not in refused.text and 'role="alert"' in refused.text
    assert console.repo.get_key(key_id).limits.tokens_per_minute == 500  # unchanged by the refusals
    # A model name is any string: markup is stored as given and shown as text.
    hostile: Any = console.post(f"/keys/{key_id}/limits", csrf, models=HOSTILE)
    assert hostile.status_code == 200 and HOSTILE not in hostile.text and "&lt;script&gt;" in hostile.text
    assert HOSTILE not in console.client.get(f"{UI}/tenants/acme").text
    cleared: Any = console.post(f"/keys/{key_id}/limits", csrf)
    assert cleared.status_code == 200 and console.repo.get_key(key_id).limits.tokens_per_minute is None
    assert console.client.get(f"{UI}/keys/sk-not-an-id").status_code == 404
    assert console.post(f"/keys/{key_id}/limits", None, tokens_per_minute="1").status_code == 403  # type: ignore[attr-defined]
