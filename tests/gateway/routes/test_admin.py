"""The admin API and GET /v1/usage on a minimal app: flows, body errors, authorization matrix."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app
from tests.tenancy.clock import START, FakeClock
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import exception_handlers
from weir.gateway.routes.admin import admin_routes
from weir.migrations.migrate import upgrade
from weir.tenancy.keys.keys import KeyHasher, generate_key
from weir.tenancy.repository.admin_token import ensure_admin_token
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn

QUIET = {"name": "quiet", "priority": "interactive", "weight": 1,
         "quota": {"tokens_per_minute": 20000, "max_concurrent": 8, "ttft_slo_ms": 2000}}  # fmt: skip


@dataclass
class Api:
    client: TestClient
    repo: TenancyRepo
    clock: FakeClock
    admin: dict[str, str]

    def tenant_key(self, tenant: str, **body: object) -> tuple[str, dict[str, str]]:
        """Issue a key through the API; its id and the headers that use it."""
        response = self.client.post(f"/admin/v1/tenants/{tenant}/keys", json=body, headers=self.admin)
        assert response.status_code == 201, response.text
        return response.json()["id"], {"Authorization": f"Bearer {response.json()['key']}"}


def _app(repo: TenancyRepo, authenticator: Authenticator, admin_auth: AdminAuthenticator) -> Starlette:
    """The admin routes in an app that answers their errors as the gateway's does."""
    return Starlette(
        routes=admin_routes(repo, authenticator, admin_auth), exception_handlers=exception_handlers()
    )


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    clock = FakeClock()
    repo = TenancyRepo(db, KeyHasher(b"pepper"), clock=clock)
    token = ensure_admin_token(repo, None)
    assert token is not None
    # A generous throttle: the matrix below fails many times from the test client's address.
    authenticator = Authenticator(repo, AuthSettings(max_failures=10_000))
    admin_auth = AdminAuthenticator(repo, None, throttle=authenticator.throttle)
    with TestClient(_app(repo, authenticator, admin_auth)) as client:
        yield Api(client, repo, clock, {"Authorization": f"Bearer {token}"})
    db.dispose()


def test_tenant_lifecycle(api: Api) -> None:
    c, admin = api.client, api.admin
    created = c.post("/admin/v1/tenants", json=QUIET, headers=admin)
    assert created.status_code == 201
    body = created.json()
    assert (body["name"], body["priority"], body["status"], body["cache_scope"]) == (
        "quiet", "interactive", "active", "quiet"
    )  # fmt: skip
    assert body["quota"]["max_concurrent"] == 8 and body["quota"]["tokens_per_day"] is None
    assert c.post("/admin/v1/tenants", json=QUIET, headers=admin).status_code == 409
    c.post("/admin/v1/tenants", json={"name": "noisy"}, headers=admin)
    listed = c.get("/admin/v1/tenants", headers=admin).json()
    assert listed["object"] == "list" and [t["name"] for t in listed["data"]] == ["noisy", "quiet"]
    assert c.get("/admin/v1/tenants/quiet", headers=admin).json() == body
    assert c.get("/admin/v1/tenants/nobody", headers=admin).status_code == 404
    patched = c.patch("/admin/v1/tenants/quiet", json={"priority": "batch", "weight": 4}, headers=admin)
    assert (patched.json()["priority"], patched.json()["weight"]) == ("batch", 4.0)
    quota = c.put(
        "/admin/v1/tenants/quiet/quota", json={"tokens_per_day": 10**9, "models": ["m"]}, headers=admin
    )
    assert quota.json()["quota"]["tokens_per_day"] == 10**9
    assert quota.json()["quota"]["max_concurrent"] is None  # PUT replaces the whole quota
    suspended = c.post("/admin/v1/tenants/quiet/suspend", headers=admin)
    assert suspended.json()["status"] == "suspended"
    actions = [e["action"] for e in c.get("/admin/v1/audit", headers=admin).json()["data"]]
    assert actions[:4] == ["tenant.suspend", "quota.set", "tenant.update", "tenant.create"]
    scoped = c.get("/admin/v1/audit", params={"tenant": "noisy"}, headers=admin).json()["data"]
    assert [e["action"] for e in scoped] == ["tenant.create"]
    assert scoped[0]["actor"].startswith("admin-api ")


def test_keys_issue_list_revoke_rotate(api: Api) -> None:
    c, admin = api.client, api.admin
    c.post("/admin/v1/tenants", json=QUIET, headers=admin)
    issued = c.post("/admin/v1/tenants/quiet/keys", json={"scopes": ["usage"]}, headers=admin)
    assert issued.status_code == 201
    assert issued.headers["cache-control"] == "no-store"
    key = issued.json()
    assert set(key) >= {"id", "key"} and key["key"].startswith(key["prefix"])
    listed = c.get("/admin/v1/tenants/quiet/keys", headers=admin).json()["data"]
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]
    assert key["key"] not in c.get("/admin/v1/tenants/quiet/keys", headers=admin).text
    rotated = c.post(f"/admin/v1/keys/{key['id']}/rotate", headers=admin)
    assert rotated.status_code == 201 and rotated.json()["scopes"] == ["usage"]
    old = {"Authorization": f"Bearer {key['key']}"}
    new = {"Authorization": f"Bearer {rotated.json()['key']}"}
    assert c.get("/v1/usage", headers=old).status_code == 401
    assert c.get("/v1/usage", headers=new).status_code == 200
    assert c.post(f"/admin/v1/keys/{key['id']}/rotate", headers=admin).status_code == 409
    revoked = c.delete(f"/admin/v1/keys/{rotated.json()['id']}", headers=admin)
    assert revoked.json()["state"] == "revoked"
    assert c.get("/v1/usage", headers=new).status_code == 401  # this replica's cache, invalidated at once
    assert c.delete("/admin/v1/keys/" + "a" * 16, headers=admin).status_code == 404
    assert c.delete("/admin/v1/keys/not-an-id", headers=admin).status_code == 404


def test_usage_per_day_for_admin_and_tenant(api: Api) -> None:
    c, admin = api.client, api.admin
    for name in ("acme", "globex"):
        c.post("/admin/v1/tenants", json={"name": name}, headers=admin)
    acme_id, acme = api.tenant_key("acme")
    for day, tokens in ((0, 100), (0, 50), (1, 10)):
        api.repo.record_usage(
            UsageRecordIn(
                f"r{day}{tokens}",
                "acme",
                acme_id,
                "m",
                UsageStatus.COMPLETED,
                prompt_tokens=tokens,
                completion_tokens=1,
                created_at=START + dt.timedelta(days=day),
            )  # fmt: skip
        )
    api.repo.record_usage(UsageRecordIn("g", "globex", None, "m", UsageStatus.FAILED, 7, 0))
    usage = c.get("/admin/v1/tenants/acme/usage", headers=admin).json()
    assert [(d["day"], d["prompt_tokens"], d["requests"]) for d in usage["data"]] == [
        ("2030-01-01", 150, 2),
        ("2030-01-02", 10, 1),
    ]
    assert usage["total"]["total_tokens"] == 163
    ranged = c.get("/admin/v1/tenants/acme/usage", params={"since": "2030-01-02"}, headers=admin).json()
    assert [d["day"] for d in ranged["data"]] == ["2030-01-02"]
    own = c.get("/v1/usage", headers=acme).json()
    assert own["tenant"] == "acme" and own["total"] == usage["total"]
    bad = c.get("/admin/v1/tenants/acme/usage", params={"since": "yesterday"}, headers=admin)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "since"
    # One endpoint's usage (the records name it since migration 0012).
    record = UsageRecordIn("resp", "acme", acme_id, "m", UsageStatus.COMPLETED, 3, 1, endpoint="response")
    api.repo.record_usage(record)
    for path, headers in (("/v1/usage", acme), ("/admin/v1/tenants/acme/usage", admin)):
        only = c.get(path, params={"endpoint": "response"}, headers=headers).json()
        assert (only["total"]["requests"], only["total"]["prompt_tokens"]) == (1, 3)
    bad = c.get("/v1/usage", params={"endpoint": "Chat!"}, headers=acme)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "endpoint"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("POST", "/admin/v1/tenants", b"{not json", 400, None),
        ("POST", "/admin/v1/tenants", b"[1, 2]", 400, None),
        ("POST", "/admin/v1/tenants", b'{"priority": "batch"}', 422, "name"),
        (
            "POST",
            "/admin/v1/tenants",
            b'{"name": "a", "quota": {"tokens_per_minut": 1}}',
            422,
            "quota.tokens_per_minut",
        ),
        (
            "POST",
            "/admin/v1/tenants",
            b'{"name": "a", "quota": {"max_concurrent": 0}}',
            422,
            "quota.max_concurrent",
        ),
        ("POST", "/admin/v1/tenants", b'{"name": "A B"}', 422, "name"),
        ("PATCH", "/admin/v1/tenants/acme", b"{}", 400, None),
        ("PATCH", "/admin/v1/tenants/acme", b'{"status": "paused"}', 422, "status"),
        ("PUT", "/admin/v1/tenants/acme/quota", b'{"max_output_tokens": "many"}', 422, "max_output_tokens"),
        ("POST", "/admin/v1/tenants/acme/keys", b'{"expires_at": "2020-01-01T00:00:00Z"}', 422, "expires_at"),
        ("POST", "/admin/v1/tenants/acme/keys", b'{"scopes": ["root"]}', 422, "scopes"),
        ("GET", "/admin/v1/audit?limit=0", None, 422, "limit"),
    ],
)
def test_body_errors_name_the_field(
    api: Api, method: str, path: str, body: bytes | None, status: int, param: str | None
) -> None:
    api.client.post("/admin/v1/tenants", json={"name": "acme"}, headers=api.admin)
    response = api.client.request(method, path, content=body, headers=api.admin)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


# -- the authorization matrix ------------------------------------------------------------------------

ADMIN_ENDPOINTS = [
    ("POST", "/admin/v1/tenants"),
    ("GET", "/admin/v1/tenants"),
    ("GET", "/admin/v1/tenants/acme"),
    ("PATCH", "/admin/v1/tenants/acme"),
    ("POST", "/admin/v1/tenants/acme/suspend"),
    ("PUT", "/admin/v1/tenants/acme/quota"),
    ("POST", "/admin/v1/tenants/acme/keys"),
    ("GET", "/admin/v1/tenants/acme/keys"),
    ("GET", "/admin/v1/tenants/acme/usage"),
    ("GET", "/admin/v1/tenants/globex/usage"),
    ("DELETE", "/admin/v1/keys/aaaaaaaaaaaaaaaa"),
    ("POST", "/admin/v1/keys/aaaaaaaaaaaaaaaa/rotate"),
    ("GET", "/admin/v1/audit"),
]


def test_authorization_matrix(api: Api) -> None:
    c, admin = api.client, api.admin
    for name in ("acme", "globex"):
        c.post("/admin/v1/tenants", json={"name": name}, headers=admin)
    acme_id, acme = api.tenant_key("acme")
    _, globex = api.tenant_key("globex")
    revoked_id, revoked = api.tenant_key("acme")
    c.delete(f"/admin/v1/keys/{revoked_id}", headers=admin)
    _, expiring = api.tenant_key("acme", expires_at=(START + dt.timedelta(hours=1)).isoformat())
    _, inference_only = api.tenant_key("acme", scopes=["inference"])
    before = c.get("/admin/v1/tenants/acme", headers=admin).json()

    # A tenant key (or none, or a made-up token) cannot call any admin endpoint.
    for method, path in ADMIN_ENDPOINTS:
        for headers in (acme, globex, {}, {"Authorization": "Bearer weir-admin-guess"}):
            response = c.request(method, path, json={"name": "x"}, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.json()["error"]["code"] == "invalid_admin_token"
    assert c.get("/admin/v1/tenants/acme", headers=admin).json() == before  # nothing changed

    # A tenant sees its own usage only.
    assert c.get("/v1/usage", headers=acme).json()["tenant"] == "acme"
    assert c.get("/v1/usage", headers=globex).json()["tenant"] == "globex"
    other = c.get("/v1/usage", params={"tenant": "globex"}, headers=acme)
    assert other.status_code == 403
    assert c.get("/v1/usage", params={"tenant": "acme"}, headers=acme).status_code == 200

    # The admin token is not a tenant key; revoked, expired, unknown and missing keys are refused alike.
    api.clock.advance(hours=1)
    refusals = [
        c.get("/v1/usage", headers=h)
        for h in (admin, revoked, expiring, {}, {"Authorization": f"Bearer {generate_key().key}"})
    ]
    assert {r.status_code for r in refusals} == {401}
    assert len({r.text for r in refusals}) == 1  # the same body whatever the reason

    # Scopes and suspension.
    assert c.get("/v1/usage", headers=inference_only).status_code == 403
    c.post("/admin/v1/tenants/acme/suspend", headers=admin)
    suspended = c.get("/v1/usage", headers=acme)
    assert suspended.status_code == 403 and suspended.json()["error"]["code"] == "tenant_suspended"
    assert c.get("/v1/usage", headers=globex).status_code == 200
    assert acme_id  # issued through the API


def test_unknown_admin_paths(api: Api) -> None:
    assert api.client.get("/admin/v1/secrets").status_code == 401  # no route map without the token
    missing = api.client.get("/admin/v1/secrets", headers=api.admin)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_repeated_admin_failures_are_throttled(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher())
    authenticator = Authenticator(repo, AuthSettings(max_failures=3))
    admin_auth = AdminAuthenticator(repo, "the-configured-admin-token", throttle=authenticator.throttle)
    with TestClient(_app(repo, authenticator, admin_auth)) as c:
        codes = [
            c.get("/admin/v1/tenants", headers={"Authorization": "Bearer nope"}).status_code for _ in range(4)
        ]
        assert codes == [401, 401, 401, 429]
        blocked = c.get("/admin/v1/tenants", headers={"Authorization": "Bearer nope"})
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert blocked.json()["error"]["code"] == "too_many_auth_failures"
        # Only failed attempts are refused: the real token still works from the same address.
        real = c.get("/admin/v1/tenants", headers={"Authorization": "Bearer the-configured-admin-token"})
        assert real.status_code == 200
    db.dispose()


# -- cache scopes (issue 10, defect 9) ---------------------------------------------------------------


def _conflict(response: Any, param: str) -> None:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"], error["type"]) == (
        "cache_scope_conflict", param, "invalid_request_error"
    )  # fmt: skip
    assert "share_cache_scope_with" in error["message"]  # says how to share on purpose


def test_a_cache_scope_is_never_joined_by_accident(api: Api) -> None:
    c, admin = api.client, api.admin
    assert c.post("/admin/v1/tenants", json={"name": "tb"}, headers=admin).status_code == 201
    # Another tenant's scope, by its name (tb's default scope is its name).
    _conflict(
        c.post("/admin/v1/tenants", json={"name": "ok2", "cache_scope": "tb"}, headers=admin), "cache_scope"
    )
    # A custom scope already in use.
    assert (
        c.post("/admin/v1/tenants", json={"name": "tc", "cache_scope": "team"}, headers=admin).status_code
        == 201
    )
    _conflict(
        c.post("/admin/v1/tenants", json={"name": "td", "cache_scope": "team"}, headers=admin), "cache_scope"
    )
    # A new tenant named after an existing custom scope would join it with its default scope.
    _conflict(c.post("/admin/v1/tenants", json={"name": "team"}, headers=admin), "name")
    # A scope named after an existing tenant that does not use it (yet): still that tenant's name.
    assert c.patch("/admin/v1/tenants/tb", json={"cache_scope": "tb-own"}, headers=admin).status_code == 200
    _conflict(
        c.post("/admin/v1/tenants", json={"name": "te", "cache_scope": "tb"}, headers=admin), "cache_scope"
    )
    # Updates follow the same rules.
    assert c.post("/admin/v1/tenants", json={"name": "tf"}, headers=admin).status_code == 201
    _conflict(c.patch("/admin/v1/tenants/tf", json={"cache_scope": "team"}, headers=admin), "cache_scope")
    _conflict(c.patch("/admin/v1/tenants/tf", json={"cache_scope": "tb-own"}, headers=admin), "cache_scope")
    scopes = {t["name"]: t["cache_scope"] for t in c.get("/admin/v1/tenants", headers=admin).json()["data"]}
    assert scopes == {"tb": "tb-own", "tc": "team", "tf": "tf"}  # nothing refused was written
    actions = [e["action"] for e in c.get("/admin/v1/audit", headers=admin).json()["data"]]
    assert actions.count("tenant.create") == 3 and actions.count("tenant.update") == 1


def test_sharing_a_cache_scope_is_explicit_and_audited(api: Api) -> None:
    c, admin = api.client, api.admin
    c.post("/admin/v1/tenants", json={"name": "tb"}, headers=admin)
    shared = c.post("/admin/v1/tenants", json={"name": "ok2", "share_cache_scope_with": "tb"}, headers=admin)
    assert shared.status_code == 201 and shared.json()["cache_scope"] == "tb"
    event = c.get("/admin/v1/audit", params={"tenant": "ok2"}, headers=admin).json()["data"][0]
    assert event["action"] == "tenant.create"
    assert event["details"]["cache_scope"] == "tb" and event["details"]["share_cache_scope_with"] == "tb"
    # An existing tenant joins on purpose, then leaves for a private scope again.
    c.post("/admin/v1/tenants", json={"name": "tg"}, headers=admin)
    joined = c.patch("/admin/v1/tenants/tg", json={"share_cache_scope_with": "ok2"}, headers=admin)
    assert joined.status_code == 200 and joined.json()["cache_scope"] == "tb"
    event = c.get("/admin/v1/audit", params={"tenant": "tg"}, headers=admin).json()["data"][0]
    assert event["details"] == {"cache_scope": "tb", "share_cache_scope_with": "ok2"}
    left = c.patch("/admin/v1/tenants/tg", json={"cache_scope": "tg"}, headers=admin)
    assert left.status_code == 200 and left.json()["cache_scope"] == "tg"
    # A tenant named after a shared scope joins it only when asked to.
    c.post("/admin/v1/tenants", json={"name": "th", "cache_scope": "crew"}, headers=admin)
    _conflict(c.post("/admin/v1/tenants", json={"name": "crew"}, headers=admin), "name")
    crew = c.post("/admin/v1/tenants", json={"name": "crew", "share_cache_scope_with": "th"}, headers=admin)
    assert crew.status_code == 201 and crew.json()["cache_scope"] == "crew"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "x1", "cache_scope": "s", "share_cache_scope_with": "tb"}, "share_cache_scope_with"),
        ({"name": "x1", "share_cache_scope_with": "nobody"}, "share_cache_scope_with"),
        ({"name": "x1", "share_cache_scope_with": "x1"}, "share_cache_scope_with"),
        ({"name": "x1", "share_cache_scope_with": 5}, "share_cache_scope_with"),
        ({"name": "x1", "share_cache_scope_with": "Not A Name"}, "share_cache_scope_with"),
    ],
)
def test_share_cache_scope_with_is_validated(api: Api, body: dict[str, object], param: str) -> None:
    api.client.post("/admin/v1/tenants", json={"name": "tb"}, headers=api.admin)
    response = api.client.post("/admin/v1/tenants", json=body, headers=api.admin)
    assert response.status_code == 422 and response.json()["error"]["param"] == param


# -- the database locked (issue 10, defect 6) -------------------------------------------------------


def test_admin_writes_on_a_locked_database_answer_503(tmp_path: Path) -> None:
    path = tmp_path / "weir.db"
    db = Database(f"sqlite:///{path}", busy_timeout_ms=100)  # the default 5 s would only slow the test
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher())
    authenticator = Authenticator(repo)
    admin_auth = AdminAuthenticator(repo, "the-configured-admin-token")
    headers = {"Authorization": "Bearer the-configured-admin-token"}
    locker = sqlite3.connect(path, isolation_level=None)
    with TestClient(_app(repo, authenticator, admin_auth)) as c:
        assert c.post("/admin/v1/tenants", json={"name": "acme"}, headers=headers).status_code == 201
        locker.execute("BEGIN EXCLUSIVE")
        try:
            for method, path_, body in [
                ("POST", "/admin/v1/tenants", {"name": "globex"}),
                ("PATCH", "/admin/v1/tenants/acme", {"weight": 2}),
                ("POST", "/admin/v1/tenants/acme/keys", {}),
            ]:
                response = c.request(method, path_, json=body, headers=headers)
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert response.json() == {
                    "error": {
                        "message": "The database is unavailable; retry later.",
                        "type": "server_error",
                        "param": None,
                        "code": "database_unavailable",
                    }
                }
            assert c.get("/admin/v1/tenants", headers=headers).status_code == 200  # reads go on (WAL)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert c.post("/admin/v1/tenants", json={"name": "globex"}, headers=headers).status_code == 201
    db.dispose()


def test_admin_errors_are_counted_in_the_error_metric(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher())
    authenticator = Authenticator(repo)
    admin_auth = AdminAuthenticator(repo, "the-configured-admin-token")
    headers = {"Authorization": "Bearer the-configured-admin-token"}
    app = make_app(FakeEngine(), extra_routes=admin_routes(repo, authenticator, admin_auth))
    with TestClient(app) as c:
        assert c.get("/admin/v1/tenants", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/admin/v1/tenants/ghost", headers=headers).status_code == 404  # tenancy error
        assert c.post("/admin/v1/tenants", json={"name": 5}, headers=headers).status_code == 422
        assert c.get("/v1/usage", headers={"Authorization": "Bearer nope"}).status_code == 401
    errors = {
        s.labels["status"]: s.value
        for family in app.state.metrics.errors.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert errors == {"401": 2.0, "404": 1.0, "422": 1.0}
    db.dispose()
