"""Usage per day and usage reports read from the per-day rollups (migration 0010), exactly.

`usage_daily` and `usage_daily_users` hold the sums of the usage records per tenant, UTC day,
key, model, model version, adapter and currency (and `user`), kept by triggers in the
transaction that writes a record, so they always equal the records.

A report over `[since, until)` reads the rollup for the UTC days the range covers whole and the
raw records for the partial days at its edges (at most two), in one UNION ALL that is then
grouped, ordered and paged as `weir.tenancy.usage.usage_report` does over the records alone: the same
groups, sums, order and pages. Grouping by hour, and grouping or filtering by endpoint, need the
records (`rollup_statements` answers None; the caller reads the records).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, literal, null, select, union_all

from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import Tenant, UsageDaily, UsageDailyUser, UsageRecord
from weir.tenancy.usage.usage import within_days
from weir.tenancy.usage.usage_report import ReportQuery

# The bit of each nullable dimension in a rollup row's `null_mask` (the row stores '' instead).
NULL_BITS = {"key_id": 1, "model_version": 2, "adapter": 4, "currency": 8, "user": 16}
# A report dimension -> its column (tenant and hour are handled apart).
_COLUMN = {"key": "key_id", "model": "model", "model_version": "model_version", "user": "user",
           "adapter": "adapter", "day": "day"}  # fmt: skip
# The sums a rollup row holds, in the order of its declaration (tenancy/models._UsageDailySums):
# every column that is not part of its key. `_record_measures` lists the records' side alike.
_MEASURES = tuple(c.name for c in UsageDaily.__table__.columns if not c.primary_key)

Rollup = type[UsageDaily] | type[UsageDailyUser]


def _rollup_value(table: Rollup, name: str) -> ColumnElement[Any]:
    """A rollup column as the record's value (NULL where `null_mask` says so)."""
    column: ColumnElement[Any] = getattr(table, name)
    bit = NULL_BITS.get(name)
    if bit is None:
        return column
    return case((table.null_mask.op("&")(bit) != 0, null()), else_=column)


def _is(status: UsageStatus) -> ColumnElement[Any]:
    return case((UsageRecord.status == status, 1), else_=0)


def _record_measures() -> list[Any]:
    return [
        literal(1),
        _is(UsageStatus.COMPLETED),
        _is(UsageStatus.FAILED),
        _is(UsageStatus.CANCELLED),
        UsageRecord.prompt_tokens,
        UsageRecord.completion_tokens,
        UsageRecord.cached_tokens,
        func.coalesce(UsageRecord.spend_micros, 0),
        case((UsageRecord.spend_micros.is_(None), 1), else_=0),
    ]


def _add_day(day: dt.date, days: int) -> dt.date | None:
    try:
        return day + dt.timedelta(days=days)
    except OverflowError:
        return None


def whole_days(since: dt.datetime, until: dt.datetime) -> tuple[dt.date, dt.date] | None:
    """The first and last UTC day lying wholly in `[since, until)`; None when there is none."""
    since, until = since.astimezone(dt.UTC), until.astimezone(dt.UTC)
    first: dt.date | None = since.date()
    if since != dt.datetime.combine(since.date(), dt.time(), dt.UTC):
        first = _add_day(since.date(), 1)
    last = _add_day(until.date(), -1)
    if first is None or last is None or first > last:
        return None
    return first, last


def _parts(q: ReportQuery, tenant_id: int | None, table: Rollup, dims: list[str]) -> Any:
    """The rollup rows of the whole days and the records of the edge days, as one subquery with
    the columns tenant_id, d0.. (dims), m0.. (measures), currency."""
    first_day = q.since.astimezone(dt.UTC).date()
    last_day = (q.until - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
    whole = whole_days(q.since, q.until)
    # The partial days: at most the first and the last (a range without a whole day spans <= 2).
    edges = sorted({d for d in (first_day, last_day) if whole is None or not whole[0] <= d <= whole[1]})
    parts: list[Select[Any]] = []
    if edges:
        raw = select(
            UsageRecord.tenant_id.label("tenant_id"),
            *(getattr(UsageRecord, _COLUMN[d]).label(f"d{i}") for i, d in enumerate(dims)),
            *(m.label(f"m{i}") for i, m in enumerate(_record_measures())),
            UsageRecord.currency.label("currency"),
        ).where(
            UsageRecord.day.in_(edges), UsageRecord.created_at >= q.since, UsageRecord.created_at < q.until
        )
        if tenant_id is not None:
            raw = raw.where(UsageRecord.tenant_id == tenant_id)
        if q.key_id is not None:
            raw = raw.where(UsageRecord.key_id == q.key_id)
        parts.append(raw)
    if whole is not None:
        rolled = select(
            table.tenant_id.label("tenant_id"),
            *(_rollup_value(table, _COLUMN[d]).label(f"d{i}") for i, d in enumerate(dims)),
            *(getattr(table, m).label(f"m{i}") for i, m in enumerate(_MEASURES)),
            _rollup_value(table, "currency").label("currency"),
        ).where(table.day >= whole[0], table.day <= whole[1], table.requests != 0)
        if tenant_id is not None:
            rolled = rolled.where(table.tenant_id == tenant_id)
        if q.key_id is not None:
            rolled = rolled.where(table.key_id == q.key_id, table.null_mask.op("&")(NULL_BITS["key_id"]) == 0)
        parts.append(rolled)
    return (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("parts")


def rollup_statements(q: ReportQuery, tenant_id: int | None) -> tuple[Select[Any], Select[Any]] | None:
    """The page and totals statements of `weir.tenancy.usage.usage_report` (same columns, same answers),
    read from the rollups; None when the report groups by hour or by endpoint, or filters by
    endpoint (read the records: the rollups do not keep the endpoint)."""
    if "hour" in q.group_by or "endpoint" in q.group_by or q.endpoint is not None:
        return None
    dims = [g for g in q.group_by if g != "tenant"]
    table: Rollup = UsageDailyUser if "user" in dims else UsageDaily
    parts = _parts(q, tenant_id, table, dims)
    sums = [func.sum(parts.c[f"m{i}"]) for i in range(len(_MEASURES))]
    keys: list[Any] = [Tenant.name if g == "tenant" else parts.c[f"d{dims.index(g)}"] for g in q.group_by]
    page = select(*keys, *sums).select_from(parts)
    if "tenant" in q.group_by:
        page = page.join(Tenant, Tenant.id == parts.c.tenant_id)
    page = page.group_by(*keys).order_by(*(k.asc().nulls_first() for k in keys))
    page = page.limit(q.limit + 1).offset(q.offset)
    # The totals do not depend on the groups: the smaller rollup, no dimensions.
    totals_parts = parts if table is UsageDaily and not dims else _parts(q, tenant_id, UsageDaily, [])
    totals = select(
        *(func.sum(totals_parts.c[f"m{i}"]) for i in range(len(_MEASURES))), func.max(totals_parts.c.currency)
    )
    return page, totals


def daily_rollup_query(tenant_id: int, since: dt.date | None, until: dt.date | None) -> Select[Any]:
    """`weir.tenancy.usage.usage.daily_usage_query`'s rows (one per UTC day with records, oldest first)
    from the rollup; read them with `weir.tenancy.usage.usage.daily_usage`."""
    query = (
        select(
            UsageDaily.day,
            *(func.sum(getattr(UsageDaily, m)) for m in _MEASURES[:7]),
        )
        .where(UsageDaily.tenant_id == tenant_id, UsageDaily.requests != 0)
        .group_by(UsageDaily.day)
        .order_by(UsageDaily.day)
    )
    return within_days(query, UsageDaily.day, since, until)
