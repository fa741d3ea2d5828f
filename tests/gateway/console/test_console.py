"""The console's login, cookie, CSRF and tenant-key refusals, tenant/key/usage/audit/live pages and
actions, hostile names rendered inert (gateway/console/routes.py), on a minimal app over SQLite."""

from __future__ import annotations

import asyncio
import re

import pytest
from starlette.testclient import TestClient

from tests.gateway.console.console_harness import (
    HOSTILE,
    MAX_LOGIN_FAILURES,
    TOKEN,
    UI,
    Console,
    csrf_of,
)
from tests.tenancy.clock import START
from weir.gateway.console.routes import LOGIN_COOKIE, SESSION_COOKIE
from weir.gateway.console.sessions import SessionStore
from weir.tenancy.catalog.model_version_records import ModelVersionSpec
from weir.tenancy.keys.keys import KEY_PREFIX
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn

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
    csrf = csrf_of(page.text)
    assert console.post("/logout", csrf).status_code == 303  # type: ignore[attr-defined]
    assert console.sessions.num_sessions == 0
    assert console.client.get(f"{UI}/tenants", follow_redirects=False).status_code == 303


def test_the_session_cookie_is_secure_over_https(console: Console) -> None:
    client = TestClient(console.client.app, base_url="https://testserver")
    form = client.get(f"{UI}/login")
    assert "secure" in form.headers["set-cookie"].lower()
    csrf = csrf_of(form.text)
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


def test_the_tenant_list_is_paged_and_searched_in_the_database(console: Console) -> None:
    for i in range(105):
        console.repo.create_tenant(TenantSpec(f"t{i:03d}"), actor="test")
    console.login()
    first = console.client.get(f"{UI}/tenants")
    assert "1–100 of 105 tenants" in first.text and first.text.count('href="/admin/ui/tenants/t') == 100
    assert "offset=100" in first.text and "Previous" not in first.text
    second = console.client.get(f"{UI}/tenants", params={"offset": "100"})
    assert "101–105 of 105 tenants" in second.text and "t104" in second.text and "Next" not in second.text
    found = console.client.get(f"{UI}/tenants", params={"q": "T10"})
    assert "1–5 of 5 tenants" in found.text  # t100-t104
    for odd in ("-5", "lots"):
        assert console.client.get(f"{UI}/tenants", params={"offset": odd}).status_code == 200
