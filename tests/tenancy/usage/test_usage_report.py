"""Usage reports: grouping, paging, exact totals (property test), CSV safety, portable SQL."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql, sqlite

from weir.engine.request import Priority
from weir.tenancy.admin_bodies.usage import UsageReportBody
from weir.tenancy.admin_bodies.usage_query import parse_report_params
from weir.tenancy.budgets.money import TokenPrices
from weir.tenancy.budgets.prices import PriceRepo, PriceSpec
from weir.tenancy.errors import FieldError, TenantNotFoundError
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir.tenancy.usage.usage_report import (
    GROUPS,
    ReportQuery,
    UsageReport,
    UsageSums,
    page_statement,
    parse_group_by,
    report_csv,
    safe_cell,
)


def report_json(report: UsageReport) -> dict[str, Any]:
    """The report's JSON answer, as the admin API renders it."""
    return UsageReportBody.of(report).json_body()


T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
STATUSES = [UsageStatus.COMPLETED, UsageStatus.FAILED, UsageStatus.CANCELLED]


# Prices (micro-units per million tokens): m1@v1 changes price at PRICE_CHANGE; the other
# versions of m1 take m1's price; m2 and "=cmd" have none.
V1_BEFORE = TokenPrices(150_000, 75_000, 600_000)
V1_AFTER = TokenPrices(170_001, 1, 999_999)
M1 = TokenPrices(3, 2, 7)
PRICE_CHANGE = T0 + dt.timedelta(days=15)


def _expected_spend(r: UsageRecordIn) -> int | None:
    assert r.created_at is not None
    if r.model_version == "m1@v1":
        prices = V1_BEFORE if r.created_at < PRICE_CHANGE else V1_AFTER
    elif (r.model_version or "").startswith("m1@") or r.model == "m1":
        prices = M1
    else:
        return None
    exact = (r.prompt_tokens - r.cached_tokens) * prices.input + r.cached_tokens * prices.cached_input
    exact += r.completion_tokens * prices.output
    whole, rest = divmod(exact, 1_000_000)
    return whole + (rest >= 500_000)  # half up


def _setup(repo: TenancyRepo) -> dict[str, list[str]]:
    """Two tenants with two keys each; their key ids by tenant."""
    before = T0 - dt.timedelta(days=1)
    prices = PriceRepo(repo.db, clock=lambda: before)
    prices.set_price(PriceSpec("m1@v1", "USD", V1_BEFORE), actor="test")
    prices.set_price(PriceSpec("m1", "USD", M1), actor="test")
    prices.set_price(PriceSpec("m1@v1", "USD", V1_AFTER, PRICE_CHANGE), actor="test")
    keys: dict[str, list[str]] = {}
    for name in ("acme", "beta"):
        repo.create_tenant(TenantSpec(name, Priority.STANDARD, 1.0), actor="test")
        keys[name] = [repo.issue_key(name, KeySpec(), actor="test").view.id for _ in range(2)]
    return keys


def _record(rid: str, tenant: str, key: str | None, when: dt.datetime, **kw: Any) -> UsageRecordIn:
    return UsageRecordIn(
        request_id=rid,
        tenant_id=tenant,
        key_id=key,
        model=kw.pop("model", "m"),
        status=kw.pop("status", UsageStatus.COMPLETED),
        prompt_tokens=kw.pop("prompt", 10),
        completion_tokens=kw.pop("completion", 5),
        cached_tokens=kw.pop("cached", 0),
        created_at=when,
        **kw,
    )


def _all_pages(repo: TenancyRepo, query: ReportQuery) -> tuple[list[dict[str, Any]], dict[str, int]]:
    rows: list[dict[str, Any]] = []
    offset: int | None = 0
    totals: dict[str, int] = {}
    while offset is not None:
        body = report_json(repo.usage_report(ReportQuery(**{**query.__dict__, "offset": offset})))
        rows += body["data"]
        totals = body["totals"]
        offset = body["next_offset"]
    return rows, totals


record_spec = st.tuples(
    st.integers(0, 3),  # tenant/key choice
    st.integers(-60, 3 * 24 * 60),  # minutes after T0 (some before the range)
    st.sampled_from(["m1", "m2", "=cmd"]),
    st.sampled_from([None, "u1", "@u2"]),
    st.sampled_from([None, "m1@v1", "m1@v2"]),
    st.sampled_from(STATUSES),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 1000),
)


def _expected_group(r: UsageRecordIn, group_by: list[str]) -> tuple[Any, ...]:
    assert r.created_at is not None
    values = {
        "tenant": r.tenant_id,
        "key_id": r.key_id,
        "model": r.model,
        "model_version": r.model_version,
        "user": r.user,
        "adapter": r.adapter,
        "endpoint": r.endpoint,
        "day": r.created_at.date().isoformat(),
        "hour": r.created_at.strftime("%Y-%m-%dT%H:00:00Z"),
    }
    return tuple(values["key_id" if g == "key" else g] for g in group_by)


ENDPOINTS = ("chat.completion", "response", None)  # None: a record written before migration 0012


def _sums_of(records: list[UsageRecordIn]) -> dict[str, int]:
    s = UsageSums(
        requests=len(records),
        completed=sum(r.status == UsageStatus.COMPLETED for r in records),
        failed=sum(r.status == UsageStatus.FAILED for r in records),
        cancelled=sum(r.status == UsageStatus.CANCELLED for r in records),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        spend_micros=sum(_expected_spend(r) or 0 for r in records),
        unpriced=sum(_expected_spend(r) is None for r in records),
    )
    return {**s.__dict__, "total_tokens": s.total_tokens}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(record_spec, max_size=40),
    group_by=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True),
    limit=st.integers(1, 7),
    span_hours=st.integers(1, 60),
)
def test_totals_equal_the_records_and_the_pages(
    repo: TenancyRepo, specs: list[tuple[Any, ...]], group_by: list[str], limit: int, span_hours: int
) -> None:
    # The repo fixture lives across examples: each example writes into its own 10-day range.
    keys = getattr(repo, "_test_keys", None) or _setup(repo)
    run = getattr(repo, "_test_run", 0) + 1
    repo._test_keys, repo._test_run = keys, run  # type: ignore[attr-defined]
    base = T0 + dt.timedelta(days=10 * run)
    records = []
    for i, (who, minutes, model, user, version, status, p, c, cached) in enumerate(specs):
        tenant = "acme" if who < 2 else "beta"
        key = keys[tenant][who % 2] if who != 3 else None
        when = base + dt.timedelta(minutes=minutes)
        records.append(_record(f"run{run}-{i}", tenant, key, when, model=model, user=user,
                               model_version=version, status=status, prompt=p, completion=c,
                               cached=min(cached, p), endpoint=ENDPOINTS[i % len(ENDPOINTS)]))  # fmt: skip
    if records:
        repo.record_usages(records)
    until = base + dt.timedelta(hours=span_hours)
    query = ReportQuery(since=base, until=until, group_by=tuple(group_by), limit=limit)
    inside = [r for r in records if r.created_at is not None and base <= r.created_at < until]

    rows, totals = _all_pages(repo, query)

    assert totals == _sums_of(inside)
    assert {m: sum(row[m] for row in rows) for m in totals} == totals
    fields = ["key_id" if g == "key" else g for g in group_by]
    got = {tuple(row[f] for f in fields): row["requests"] for row in rows}
    assert len(got) == len(rows)  # every group once across the pages
    assert got == dict(Counter(_expected_group(r, group_by) for r in inside))


def test_groups_by_tenant_key_and_hour_with_filters(repo: TenancyRepo) -> None:
    keys = _setup(repo)
    a1, a2 = keys["acme"]
    repo.record_usages([
        _record("1", "acme", a1, T0 + dt.timedelta(minutes=5), prompt=100, cached=40),
        _record("2", "acme", a1, T0 + dt.timedelta(minutes=65), prompt=7),
        _record("3", "acme", a2, T0 + dt.timedelta(minutes=10), status=UsageStatus.FAILED),
        _record("4", "beta", None, T0 + dt.timedelta(minutes=20)),
        _record("5", "acme", a1, T0 + dt.timedelta(days=1)),  # outside [since, until)
    ])  # fmt: skip
    q = ReportQuery(since=T0, until=T0 + dt.timedelta(days=1), group_by=("tenant", "key", "hour"))
    body = report_json(repo.usage_report(q))
    assert [(r["tenant"], r["key_id"], r["hour"], r["requests"]) for r in body["data"]] == sorted(
        [
            ("acme", a1, "2026-03-01T00:00:00Z", 1),
            ("acme", a1, "2026-03-01T01:00:00Z", 1),
            ("acme", a2, "2026-03-01T00:00:00Z", 1),
            ("beta", None, "2026-03-01T00:00:00Z", 1),
        ],
        key=lambda t: (t[0], t[1] or "", t[2]),
    )
    assert body["totals"]["requests"] == 4 and body["totals"]["failed"] == 1
    assert body["totals"]["prompt_tokens"] == 100 + 7 + 10 + 10 and body["totals"]["cached_tokens"] == 40
    assert body["next_offset"] is None and body["has_more"] is False

    only = report_json(repo.usage_report(ReportQuery(since=T0, until=T0 + dt.timedelta(days=2),
                                                     group_by=("day",), tenant="acme", key_id=a1)))  # fmt: skip
    assert [(r["day"], r["requests"]) for r in only["data"]] == [("2026-03-01", 2), ("2026-03-02", 1)]
    with pytest.raises(TenantNotFoundError):
        repo.usage_report(ReportQuery(since=T0, until=T0 + dt.timedelta(days=1), tenant="nobody"))


def test_groups_and_filters_by_endpoint(repo: TenancyRepo) -> None:
    keys = _setup(repo)
    a1 = keys["acme"][0]
    repo.record_usages([
        _record("1", "acme", a1, T0 + dt.timedelta(minutes=5), endpoint="response"),
        _record("2", "acme", a1, T0 + dt.timedelta(days=1, minutes=5), endpoint="response", prompt=7),
        _record("3", "acme", a1, T0 + dt.timedelta(minutes=10), endpoint="chat.completion"),
        _record("4", "beta", None, T0 + dt.timedelta(minutes=20)),  # written before 0012: no endpoint
    ])  # fmt: skip
    # Whole days (the rollups' range): grouping or filtering by endpoint reads the records.
    week = {"since": T0, "until": T0 + dt.timedelta(days=7)}
    body = report_json(repo.usage_report(ReportQuery(**week, group_by=("endpoint",))))
    assert [(r["endpoint"], r["requests"]) for r in body["data"]] == [
        (None, 1),
        ("chat.completion", 1),
        ("response", 2),
    ]
    only = report_json(
        repo.usage_report(ReportQuery(**week, group_by=("tenant", "day"), endpoint="response"))
    )
    assert [(r["tenant"], r["day"], r["prompt_tokens"]) for r in only["data"]] == [
        ("acme", "2026-03-01", 10),
        ("acme", "2026-03-02", 7),
    ]
    assert only["totals"]["requests"] == 2 and only["endpoint"] == "response"
    days = repo.usage_by_day("acme", since=T0.date(), endpoint="chat.completion")
    assert [(d.day, d.num_requests) for d in days] == [(T0.date(), 1)]
    assert [d.num_requests for d in repo.usage_by_day("acme", since=T0.date())] == [2, 1]
    with pytest.raises(FieldError):
        repo.usage_by_day("acme", endpoint="DROP TABLE")
    q, _ = parse_report_params({"since": "2026-03-01", "until": "2026-03-02", "group_by": "endpoint",
                                "endpoint": "response"})  # fmt: skip
    assert q.group_by == ("endpoint",) and q.endpoint == "response"
    with pytest.raises(FieldError) as info:
        parse_report_params({"since": "2026-03-01", "until": "2026-03-02", "endpoint": "Chat!"})
    assert info.value.field == "endpoint"


def test_paging_is_bounded_and_says_what_follows(repo: TenancyRepo) -> None:
    _setup(repo)
    repo.record_usages([_record(str(i), "acme", None, T0 + dt.timedelta(hours=i)) for i in range(5)])
    q = ReportQuery(since=T0, until=T0 + dt.timedelta(days=1), group_by=("hour",), limit=2)
    first = report_json(repo.usage_report(q))
    assert len(first["data"]) == 2 and first["next_offset"] == 2 and first["totals"]["requests"] == 5
    last = report_json(repo.usage_report(ReportQuery(**{**q.__dict__, "offset": 4})))
    assert len(last["data"]) == 1 and last["next_offset"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"until": "2026-03-02"}, "since"),
        ({"since": "2026-03-02"}, "until"),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "until"),
        ({"since": "2026-03-01", "until": "2026-03-01"}, "until"),
        ({"since": "2026-03-01T00:00:00", "until": "2026-03-02"}, "since"),
        ({"since": "yesterday", "until": "2026-03-02"}, "since"),
        ({"since": "2026-03-01", "until": "2026-03-02", "group_by": "tenant,color"}, "group_by"),
        ({"since": "2026-03-01", "until": "2026-03-02", "group_by": "day,day"}, "group_by"),
        ({"since": "2026-03-01", "until": "2026-03-02", "group_by": ""}, "group_by"),
        ({"since": "2026-03-01", "until": "2026-03-02", "limit": "0"}, "limit"),
        ({"since": "2026-03-01", "until": "2026-03-02", "limit": "1001"}, "limit"),
        ({"since": "2026-03-01", "until": "2026-03-02", "offset": "-1"}, "offset"),
        ({"since": "2026-03-01", "until": "2026-03-02", "format": "xlsx"}, "format"),
        ({"since": "2026-03-01", "until": "2026-03-02", "colour": "x"}, "colour"),
    ],
)
def test_bad_parameters_name_the_parameter(params: dict[str, str], field: str) -> None:
    with pytest.raises(FieldError) as info:
        parse_report_params(params)
    assert info.value.field == field


def test_parameters() -> None:
    q, fmt = parse_report_params({"since": "2026-03-01", "until": "2026-03-01T06:00:00+02:00",
                                  "group_by": " user , hour", "format": "csv", "limit": "5"})  # fmt: skip
    assert (q.since, q.until) == (T0, T0 + dt.timedelta(hours=4))
    assert q.group_by == ("user", "hour") and fmt == "csv" and q.limit == 5 and q.offset == 0
    assert parse_group_by("tenant") == ("tenant",)


HOSTILE = ["=HYPERLINK(\"http://evil\",\"x\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "＝1+1",
           'a,"b"\r\nc', "plain"]  # fmt: skip


@pytest.mark.parametrize("value", HOSTILE)
def test_csv_cells_cannot_be_formulas_or_break_rows(value: str) -> None:
    body = {
        "group_by": ["tenant", "key", "user", "model"],
        "data": [{"tenant": value, "key_id": value, "user": value, "model": None,
                  **dict.fromkeys(("requests", "completed", "failed", "cancelled", "prompt_tokens",
                                   "completion_tokens", "cached_tokens", "total_tokens",
                                   "spend_micros", "unpriced"), 1)}],
    }  # fmt: skip
    rows = list(csv.reader(io.StringIO(report_csv(body), newline="")))
    assert rows[0][:4] == ["tenant", "key_id", "user", "model"] and len(rows) == 2
    for cell in rows[1][:3]:
        assert cell == (value if value == "plain" or value.startswith("a,") else "'" + value)
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r", "＝"))
    assert rows[1][3] == "" and rows[1][4:] == ["1"] * 10
    assert safe_cell(-5) == -5 and safe_cell(None) == ""


def test_csv_of_hostile_user_and_model_from_the_database(repo: TenancyRepo) -> None:
    _setup(repo)
    repo.record_usages([_record("1", "acme", None, T0, user="=cmd|' /C calc'!A0", model="@evil")])
    q = ReportQuery(since=T0, until=T0 + dt.timedelta(hours=1), group_by=("tenant", "user", "model"))
    rows = list(csv.reader(io.StringIO(report_csv(report_json(repo.usage_report(q))), newline="")))
    assert rows[1][:3] == ["acme", "'=cmd|' /C calc'!A0", "'@evil"]


def test_the_page_query_compiles_for_postgresql_and_sqlite() -> None:
    q = ReportQuery(since=T0, until=T0 + dt.timedelta(days=1), group_by=tuple(GROUPS))
    pg = str(page_statement(q, 1).compile(dialect=postgresql.dialect()))
    assert "EXTRACT(HOUR FROM (usage_records.created_at) AT TIME ZONE 'UTC')" in pg
    assert "NULLS FIRST" in pg
    lite = str(page_statement(q, 1).compile(dialect=sqlite.dialect()))
    assert "strftime('%H', usage_records.created_at)" in lite
