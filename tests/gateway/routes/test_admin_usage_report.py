"""GET /admin/v1/usage/report: JSON and CSV, validation naming the parameter, admin token only."""

from __future__ import annotations

import csv
import datetime as dt
import io

from tests.gateway.routes import test_admin
from tests.gateway.routes.test_admin import QUIET, Api
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn

api = test_admin.api  # the admin API fixture

URL = "/admin/v1/usage/report"
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def _seed(a: Api) -> str:
    assert a.client.post("/admin/v1/tenants", json=QUIET, headers=a.admin).status_code == 201
    key_id, _ = a.tenant_key("quiet")
    a.repo.record_usages([
        UsageRecordIn(f"r{i}", "quiet", key_id, "m", UsageStatus.COMPLETED, 10 + i, 2,
                      created_at=T0 + dt.timedelta(minutes=40 * i), user=user)
        for i, user in enumerate(["=1+2", "@x", "bob"])
    ])  # fmt: skip
    return key_id


def test_json_report(api: Api) -> None:
    key_id = _seed(api)
    params = {"since": "2026-03-01", "until": "2026-03-02", "group_by": "key,hour", "limit": "1"}
    r = api.client.get(URL, params=params, headers=api.admin)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["data"] == [{"key_id": key_id, "hour": "2026-03-01T00:00:00Z", "requests": 2, "completed": 2,
                             "failed": 0, "cancelled": 0, "prompt_tokens": 21, "completion_tokens": 4,
                             "cached_tokens": 0, "total_tokens": 25, "spend_micros": 0, "unpriced": 2}]  # fmt: skip
    assert (
        body["next_offset"] == 1 and body["totals"]["requests"] == 3 and body["totals"]["prompt_tokens"] == 33
    )
    r = api.client.get(URL, params={**params, "offset": "1"}, headers=api.admin)
    assert r.json()["next_offset"] is None and r.json()["data"][0]["hour"] == "2026-03-01T01:00:00Z"


def test_csv_report_is_formula_safe(api: Api) -> None:
    _seed(api)
    params = {"since": "2026-03-01", "until": "2026-03-02", "group_by": "tenant,user", "format": "csv"}
    r = api.client.get(URL, params={**params, "limit": "2"}, headers=api.admin)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert r.headers["weir-next-offset"] == "2"
    r = api.client.get(URL, params=params, headers=api.admin)
    rows = list(csv.reader(io.StringIO(r.text, newline="")))
    assert rows[0][:2] == ["tenant", "user"]
    assert sorted(row[1] for row in rows[1:]) == ["'=1+2", "'@x", "bob"]
    assert "weir-next-offset" not in r.headers


def test_bad_parameters_are_422_naming_them(api: Api) -> None:
    cases = {
        "group_by": {"since": "2026-03-01", "until": "2026-03-02", "group_by": "tenant,colour"},
        "until": {"since": "2026-03-02", "until": "2026-03-01"},
        "since": {"until": "2026-03-01"},
        "limit": {"since": "2026-03-01", "until": "2026-03-02", "limit": "100000"},
    }
    for param, query in cases.items():
        r = api.client.get(URL, params=query, headers=api.admin)
        assert r.status_code == 422, (param, r.text)
        assert r.json()["error"]["param"] == param
    r = api.client.get(URL, params={"since": "2026-03-01", "until": "2026-03-02", "tenant": "nobody"},
                       headers=api.admin)  # fmt: skip
    assert r.status_code == 404


def test_needs_the_admin_token(api: Api) -> None:
    _seed(api)
    _, tenant_headers = api.tenant_key("quiet")
    params = {"since": "2026-03-01", "until": "2026-03-02"}
    assert api.client.get(URL, params=params).status_code == 401
    assert api.client.get(URL, params=params, headers=tenant_headers).status_code == 401
