"""Usage reports: usage records over a time range, grouped, one page at a time, JSON or CSV.

A report groups the records created in `[since, until)` by any of tenant, key, model, model
version, user, adapter, endpoint (the API a request came through: `chat.completion`,
`text_completion`, `message`, `response`, `tokenize`; none on records older than migration 0012),
UTC day and UTC hour, filtered by tenant, key and endpoint, and sums requests (by status), prompt,
completion and cached tokens, and spend (integer micro-units, `weir.tenancy.budgets.prices`). Pages are `limit` groups from `offset`, in the order of the
group-by dimensions (NULL first on every backend). The range's totals come from a second
aggregate over the same filter, so they equal the sum of the records exactly (integers all the
way; a backend's Decimal sums are turned into int).

Day groups use the stored UTC `day` column. Hour groups use `utc_hour(created_at)`, a SQL
expression compiled per dialect (SQLite `strftime('%H')` on the stored naive UTC text,
PostgreSQL `EXTRACT(HOUR FROM created_at AT TIME ZONE 'UTC')`, never the session time zone).

CSV is RFC 4180 through the csv module (every text cell that needs it is quoted); a text cell
that a spreadsheet would read as a formula gets a leading `'` (OWASP's CSV injection advice).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Integer, Select, case, func, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from weir.tenancy.errors import FieldError
from weir.tenancy.store.models import Tenant, UsageRecord
from weir.tenancy.usage.usage import record_count_columns
from weir.tenancy.usage.usage_records import COUNT_MEASURES, ENDPOINT_RE

GROUPS = ("tenant", "key", "model", "model_version", "user", "adapter", "endpoint", "day", "hour")
DEFAULT_GROUP_BY = ("tenant", "day")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MEASURES = (
    *COUNT_MEASURES,
    "total_tokens",
    "spend_micros",  # micro-units of the report's `currency` (weir.tenancy.budgets.money); records without a price add 0
    "unpriced",  # records without a price (their model had none when they were made)
)
# The JSON/CSV field of each dimension (a key is named by its public id).
FIELD_OF = {g: ("key_id" if g == "key" else g) for g in GROUPS}


class utc_hour(FunctionElement[int]):  # noqa: N801 (a SQL function)
    """The UTC hour (0-23) of a UTCDateTime column, portable across SQLite and PostgreSQL."""

    type = Integer()
    name = "utc_hour"
    inherit_cache = True


@compiles(utc_hour, "sqlite")
def _utc_hour_sqlite(element: utc_hour, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite stores UTCDateTime as naive UTC text, 'YYYY-MM-DD HH:MM:SS[.ffffff]'.
    return f"CAST(strftime('%H', {compiler.process(element.clauses, **kw)}) AS INTEGER)"


@compiles(utc_hour)
def _utc_hour_default(element: utc_hour, compiler: SQLCompiler, **kw: Any) -> str:
    # PostgreSQL (timestamptz): AT TIME ZONE 'UTC' makes EXTRACT ignore the session time zone.
    return (
        f"CAST(EXTRACT(HOUR FROM ({compiler.process(element.clauses, **kw)}) AT TIME ZONE 'UTC') AS INTEGER)"
    )


@dataclass(frozen=True)
class ReportQuery:
    """What to report: records created in `[since, until)` (aware UTC), grouped, one page."""

    since: dt.datetime
    until: dt.datetime
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tenant: str | None = None
    key_id: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    endpoint: str | None = None  # only the records of this endpoint (`response`, ...)

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            value = getattr(self, name)
            if not isinstance(value, dt.datetime) or value.tzinfo is None:
                raise FieldError(name, "must be a time with a zone")
        if self.since >= self.until:
            raise FieldError("until", "must be after since")
        parse_group_by(",".join(self.group_by))
        if self.endpoint is not None and (
            not isinstance(self.endpoint, str) or ENDPOINT_RE.fullmatch(self.endpoint) is None
        ):
            raise FieldError(
                "endpoint", "must be an endpoint name: 1-32 lowercase letters, dots or underscores"
            )
        if isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_LIMIT:
            raise FieldError("limit", f"must be an integer in [1, {MAX_LIMIT}]")
        if isinstance(self.offset, bool) or self.offset < 0:
            raise FieldError("offset", "must be a non-negative integer")


@dataclass(frozen=True)
class UsageSums:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spend_micros: int = 0
    unpriced: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ReportRow:
    """One group: its dimension values (by field name) and its sums."""

    group: dict[str, str | None]
    sums: UsageSums


@dataclass(frozen=True)
class UsageReport:
    query: ReportQuery
    rows: list[ReportRow]
    totals: UsageSums  # over the whole range, every page
    next_offset: int | None  # None: this is the last page
    currency: str | None = None  # of the spend (one per deployment); None: nothing priced


def parse_group_by(value: str) -> tuple[str, ...]:
    """`tenant,day` -> ("tenant", "day"): known dimensions, each once, at least one."""
    parts = tuple(p.strip() for p in value.split(","))
    if not value.strip() or any(not p for p in parts):
        raise FieldError("group_by", f"must be a comma-separated list of {', '.join(GROUPS)}")
    for part in parts:
        if part not in GROUPS:
            raise FieldError("group_by", f"unknown dimension {part[:64]!r}; use {', '.join(GROUPS)}")
    if len(set(parts)) != len(parts):
        raise FieldError("group_by", "names a dimension twice")
    return parts


def _sums_columns() -> list[Any]:
    return [
        *record_count_columns(),
        func.sum(func.coalesce(UsageRecord.spend_micros, 0)),
        func.sum(case((UsageRecord.spend_micros.is_(None), 1), else_=0)),
    ]


def _sums(values: Sequence[Any]) -> UsageSums:
    # SUM over no rows is NULL; PostgreSQL sums are Decimal.
    return UsageSums(*(int(v) if v is not None else 0 for v in values))


def _dimension(group: str) -> list[Any]:
    """The SQL expressions a dimension groups and orders by."""
    if group == "tenant":
        return [Tenant.name]
    if group == "key":
        return [UsageRecord.key_id]
    if group == "hour":
        return [UsageRecord.day, utc_hour(UsageRecord.created_at)]
    return [getattr(UsageRecord, group)]


def _filtered(query: Select[Any], q: ReportQuery, tenant_id: int | None) -> Select[Any]:
    last_day = (q.until - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
    query = query.join(Tenant, Tenant.id == UsageRecord.tenant_id).where(
        UsageRecord.created_at >= q.since,
        UsageRecord.created_at < q.until,
        # Redundant with created_at, but lets the (tenant_id, day) index narrow the scan.
        UsageRecord.day >= q.since.astimezone(dt.UTC).date(),
        UsageRecord.day <= last_day,
    )
    if tenant_id is not None:
        query = query.where(UsageRecord.tenant_id == tenant_id)
    if q.key_id is not None:
        query = query.where(UsageRecord.key_id == q.key_id)
    if q.endpoint is not None:
        query = query.where(UsageRecord.endpoint == q.endpoint)
    return query


def page_statement(q: ReportQuery, tenant_id: int | None) -> Select[Any]:
    """One page of groups, plus one more row to tell whether another page follows."""
    keys = [expr for g in q.group_by for expr in _dimension(g)]
    query = select(*keys, *_sums_columns()).select_from(UsageRecord)
    query = _filtered(query, q, tenant_id).group_by(*keys)
    return query.order_by(*(k.asc().nulls_first() for k in keys)).limit(q.limit + 1).offset(q.offset)


def totals_statement(q: ReportQuery, tenant_id: int | None) -> Select[Any]:
    """The sums over the whole range (every group of every page)."""
    columns = [*_sums_columns(), func.max(UsageRecord.currency)]
    return _filtered(select(*columns).select_from(UsageRecord), q, tenant_id)


def _group_values(q: ReportQuery, values: Sequence[Any]) -> dict[str, str | None]:
    group: dict[str, str | None] = {}
    i = 0
    for g in q.group_by:
        if g == "hour":
            day, hour = values[i], values[i + 1]
            i += 2
            group["hour"] = f"{day.isoformat()}T{int(hour):02d}:00:00Z"
            continue
        value = values[i]
        i += 1
        group[FIELD_OF[g]] = value.isoformat() if isinstance(value, dt.date) else value
    return group


def build_report(
    q: ReportQuery, page_rows: Sequence[Sequence[Any]], totals_row: Sequence[Any]
) -> UsageReport:
    """The report of a page's rows (up to `limit + 1`) and the totals' row."""
    width = sum(2 if g == "hour" else 1 for g in q.group_by)
    rows = [ReportRow(_group_values(q, r[:width]), _sums(r[width:])) for r in page_rows[: q.limit]]
    more = len(page_rows) > q.limit
    *sums, currency = totals_row
    return UsageReport(q, rows, _sums(sums), q.offset + q.limit if more else None, currency)


# -- query parameters ---------------------------------------------------------------------------

FORMATS = ("json", "csv")


def parse_time(value: str, field: str) -> dt.datetime:
    """`YYYY-MM-DD` (midnight UTC) or an ISO 8601 time with a zone."""
    if len(value) == 10:
        try:
            return dt.datetime.combine(dt.date.fromisoformat(value), dt.time(), dt.UTC)
        except ValueError:
            pass
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise FieldError(field, "must be YYYY-MM-DD or an ISO 8601 time with a zone") from None
    if parsed.tzinfo is None:
        raise FieldError(field, "must include a time zone (e.g. a trailing Z)")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise FieldError(field, "must be a time between years 1 and 9999 in UTC") from None


class ReportOptions(Protocol):
    """What a report is asked for, as given: the admin API's query parameters or the CLI's options."""

    since: str
    until: str
    group_by: str
    tenant: str | None
    key_id: str | None
    endpoint: str | None
    limit: int
    offset: int


def report_query(options: ReportOptions) -> ReportQuery:
    """The repository's query for these options (`FieldError` for a bad time or grouping)."""
    return ReportQuery(
        since=parse_time(options.since, "since"),
        until=parse_time(options.until, "until"),
        group_by=parse_group_by(options.group_by),
        tenant=options.tenant,
        key_id=options.key_id,
        endpoint=options.endpoint,
        limit=options.limit,
        offset=options.offset,
    )


def report_params(query: ReportQuery, fmt: str = "json") -> dict[str, str]:
    """The query parameters of GET /admin/v1/usage/report for this query (the inverse of
    `weir.tenancy.admin_bodies.usage_query.parse_report_params`)."""
    params = {
        "since": query.since.isoformat(),
        "until": query.until.isoformat(),
        "group_by": ",".join(query.group_by),
        "limit": str(query.limit),
        "offset": str(query.offset),
        "format": fmt,
    }
    if query.tenant is not None:
        params["tenant"] = query.tenant
    if query.key_id is not None:
        params["key_id"] = query.key_id
    if query.endpoint is not None:
        params["endpoint"] = query.endpoint
    return params


# -- encodings ----------------------------------------------------------------------------------


# Characters that make a spreadsheet read a cell as a formula (with their full-width forms).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def safe_cell(value: object) -> object:
    """A CSV cell: None is empty, a formula-looking text gets a leading `'`, numbers stay."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def report_csv(body: dict[str, Any]) -> str:
    """The CSV of a report's JSON (`UsageReportBody.json_body()`, or the admin API's answer): a header row, then
    one row per group of the page. Totals and paging are in the JSON (and the API's headers)."""
    fields = [FIELD_OF[g] for g in body["group_by"]] + list(MEASURES)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(fields)
    for row in body["data"]:
        writer.writerow([safe_cell(row.get(f)) for f in fields])
    return out.getvalue()
