"""The per-day rollups: reports and usage per day read from them equal the same read from the
records, for random records (rewritten ones too), ranges not aligned to days, groupings, filters
and pages (property test), on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from weir.engine.request import Priority
from weir.tenancy.admin_bodies.usage import UsageReportBody
from weir.tenancy.budgets.money import TokenPrices
from weir.tenancy.budgets.prices import PriceRepo, PriceSpec
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import Tenant, UsageDaily, UsageDailyUser
from weir.tenancy.usage.usage import daily_usage, daily_usage_query
from weir.tenancy.usage.usage_records import DailyUsage, UsageRecordIn
from weir.tenancy.usage.usage_report import (
    GROUPS,
    ReportQuery,
    build_report,
    page_statement,
    totals_statement,
)
from weir.tenancy.usage.usage_rollups import whole_days

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
TENANTS = ("acme", "beta")


def _setup(repo: TenancyRepo) -> dict[str, list[str]]:
    """Two tenants with two keys each, and a price for m1 (so spend and currency are set)."""
    PriceRepo(repo.db, clock=lambda: T0 - dt.timedelta(days=1)).set_price(
        PriceSpec("m1", "USD", TokenPrices(3, 2, 7)), actor="test"
    )
    keys: dict[str, list[str]] = {}
    for name in TENANTS:
        repo.create_tenant(TenantSpec(name, Priority.STANDARD, 1.0), actor="test")
        keys[name] = [repo.issue_key(name, KeySpec(), actor="test").view.id for _ in range(2)]
    return keys


def _raw_report(repo: TenancyRepo, query: ReportQuery) -> dict[str, Any]:
    """The report computed from the usage records alone (the statements before the rollups)."""
    with repo.db.transaction() as session:
        tenant_id = None
        if query.tenant is not None:
            tenant_id = session.scalars(select(Tenant.id).where(Tenant.name == query.tenant)).one()
        page = list(session.execute(page_statement(query, tenant_id)))
        totals = session.execute(totals_statement(query, tenant_id)).one()
    return UsageReportBody.of(build_report(query, page, totals)).json_body()


def _raw_days(repo: TenancyRepo, tenant: str, since: dt.date, until: dt.date) -> list[DailyUsage]:
    with repo.db.transaction() as session:
        tenant_id = session.scalars(select(Tenant.id).where(Tenant.name == tenant)).one()
        return [daily_usage(r) for r in session.execute(daily_usage_query(tenant_id, since, until))]


record_spec = st.tuples(
    st.integers(0, 5),  # tenant/key choice (4, 5: no key)
    st.integers(-3 * 60, 4 * 24 * 60),  # minutes after the example's base
    st.sampled_from(["m1", "m2"]),
    st.sampled_from([None, "", "u1", "<b>u2</b>"]),
    st.sampled_from([None, "m1@v1", "m1@v2"]),
    st.sampled_from([None, "lora-a"]),
    st.sampled_from(list(UsageStatus)),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)


def _records(
    run: int, base: dt.datetime, keys: dict[str, list[str]], specs: list[Any]
) -> list[UsageRecordIn]:
    out = []
    for i, (who, minutes, model, user, version, adapter, status, prompt, completion) in enumerate(specs):
        tenant = TENANTS[who % 2]
        out.append(
            UsageRecordIn(
                request_id=f"run{run}-{i % 12}",  # some requests are written more than once
                tenant_id=tenant,
                key_id=keys[tenant][who // 2] if who < 4 else None,
                model=model,
                model_version=version,
                adapter=adapter,
                user=user,
                status=status,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=prompt // 3,
                created_at=base + dt.timedelta(minutes=minutes),
            )
        )
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.lists(record_spec, max_size=15), max_size=3),
    start_minutes=st.integers(-2 * 24 * 60, 2 * 24 * 60),
    span_minutes=st.integers(1, 4 * 24 * 60),
    group_by=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True),
    tenant=st.sampled_from([None, *TENANTS]),
    key_choice=st.sampled_from([None, 0, 1]),
    limit=st.integers(1, 6),
    offset=st.integers(0, 4),
)
def test_rollup_answers_equal_the_records(
    repo: TenancyRepo,
    batches: list[list[Any]],
    start_minutes: int,
    span_minutes: int,
    group_by: list[str],
    tenant: str | None,
    key_choice: int | None,
    limit: int,
    offset: int,
) -> None:
    # The repo fixture lives across examples: each example writes into its own 10-day range.
    keys = getattr(repo, "_test_keys", None) or _setup(repo)
    run = getattr(repo, "_test_run", 0) + 1
    repo._test_keys, repo._test_run = keys, run  # type: ignore[attr-defined]
    base = T0 + dt.timedelta(days=10 * run)
    for batch in batches:  # later batches rewrite some requests of earlier ones
        records = _records(run, base, keys, batch)
        if records:
            repo.record_usages(records)
    since = base + dt.timedelta(minutes=start_minutes)
    until = since + dt.timedelta(minutes=span_minutes)
    key_id = keys[tenant or "acme"][key_choice] if key_choice is not None else None
    query = ReportQuery(since, until, tuple(group_by), tenant, key_id, limit, offset)

    got = UsageReportBody.of(repo.usage_report(query)).json_body()

    assert got == _raw_report(repo, query)
    for name in TENANTS:
        first, last = since.date(), until.date()
        assert repo.usage_by_day(name, since=first, until=last) == _raw_days(repo, name, first, last)


def test_rollup_rows_are_the_sums_of_the_records(repo: TenancyRepo) -> None:
    """A rewritten record moves from its old group to its new one; nothing is counted twice."""
    keys = _setup(repo)
    when = T0 + dt.timedelta(hours=5)
    first = UsageRecordIn("r1", "acme", keys["acme"][0], "m1", prompt_tokens=7, completion_tokens=1,
                          cached_tokens=0, status=UsageStatus.COMPLETED, created_at=when)  # fmt: skip
    repo.record_usages([first])
    final = UsageRecordIn("r1", "acme", keys["acme"][1], "m1", prompt_tokens=70, completion_tokens=30,
                          cached_tokens=0, model_version="m1@v1", user="u", status=UsageStatus.FAILED,
                          created_at=when)  # fmt: skip
    repo.record_usages([final, final])
    with repo.db.transaction() as session:
        for table in (UsageDaily, UsageDailyUser):
            live = session.execute(
                select(table.key_id, table.model_version, table.requests, table.failed, table.prompt_tokens)
                .where(table.requests != 0)
            ).all()  # fmt: skip
            assert live == [(keys["acme"][1], "m1@v1", 1, 1, 70)]
            assert session.scalar(select(func.sum(table.requests))) == 1
    for group in ("key", "user"):  # the emptied group is not reported
        query = ReportQuery(T0, T0 + dt.timedelta(days=1), (group,))
        rows = UsageReportBody.of(repo.usage_report(query)).json_body()["data"]
        assert [(r["requests"], r["prompt_tokens"]) for r in rows] == [(1, 70)]
        assert UsageReportBody.of(repo.usage_report(query)).json_body() == _raw_report(repo, query)


def test_whole_days_of_a_range() -> None:
    day = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    assert whole_days(day, day + dt.timedelta(days=2)) == (day.date(), (day + dt.timedelta(days=1)).date())
    assert (
        whole_days(day + dt.timedelta(hours=1), day + dt.timedelta(days=2))
        == ((day + dt.timedelta(days=1)).date(),) * 2
    )
    assert whole_days(day + dt.timedelta(hours=1), day + dt.timedelta(hours=30)) is None
    east = dt.timezone(dt.timedelta(hours=2))  # a zone: the UTC days count
    assert whole_days(dt.datetime(2026, 3, 1, 2, tzinfo=east), dt.datetime(2026, 3, 2, 2, tzinfo=east)) == (
        day.date(),
        day.date(),
    )
    assert (
        whole_days(dt.datetime(9999, 12, 31, 1, tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC))
        is None
    )
