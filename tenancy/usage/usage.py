"""Usage records as rows, the per-day aggregate query, and the record counts and day range
that the reports and rollups aggregate with, for the repository.

Per-day reports group on the stored UTC `day` column (portable across SQLite and PostgreSQL,
and served by the (tenant_id, day) index) instead of a dialect-specific date function.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Insert, Select, case, func, select
from sqlalchemy.dialects import postgresql, sqlite

from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import UsageRecord
from weir.tenancy.usage.usage_records import DailyUsage, UsageRecordIn


def usage_row(record: UsageRecordIn, tenant_id: int, now: dt.datetime) -> dict[str, object]:
    """The insert parameters of one usage record (created now unless it says when)."""
    created_at = record.created_at if record.created_at is not None else now
    return {
        "request_id": record.request_id,
        "tenant_id": tenant_id,
        "key_id": record.key_id,
        "model": record.model,
        "model_version": record.model_version,
        "user": record.user,
        "adapter": record.adapter,
        "endpoint": record.endpoint,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cached_tokens": record.cached_tokens,
        "ttft_ms": record.ttft_ms,
        "e2e_ms": record.e2e_ms,
        "status": record.status,
        "finish_reason": record.finish_reason,
        "created_at": created_at,
        "day": created_at.astimezone(dt.UTC).date(),
    }


@functools.cache
def upsert_usage(backend: str) -> Insert:
    """An INSERT of usage rows where a later record of a (request_id, tenant) replaces the stored one.

    A stream writes provisional records (before its first byte, then as it goes) and its final
    one; the usage writer replays its spool in order after an outage or a crash, so the last
    record written for a request is its latest state, and replaying a batch again is harmless.
    A statement must not name one key twice (`latest_per_request` first). `backend` is
    `Database.backend`. Built once per backend (immutable, so shared): building it compiles
    the upsert's column collections, ~1 ms of the usage writer's GIL time per batch.
    """
    dialect_insert = postgresql.insert if backend == "postgresql" else sqlite.insert
    stmt = dialect_insert(UsageRecord)
    return stmt.on_conflict_do_update(
        index_elements=["request_id", "tenant_id"], set_={c: stmt.excluded[c] for c in _UPDATED_COLUMNS}
    )


# Everything a later record of the same request may change (not its identity or its day).
_UPDATED_COLUMNS = (
    "key_id",
    "model",
    "model_version",
    "user",
    "adapter",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft_ms",
    "e2e_ms",
    "status",
    "finish_reason",
    "spend_micros",  # recomputed from the new tokens at the record's (unchanged) time's price
    "currency",
    "price_id",
)


def latest_per_request(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The last row of each (request_id, tenant_id), in the order of their first appearance."""
    latest: dict[tuple[object, object], dict[str, object]] = {}
    for row in rows:
        latest[(row["request_id"], row["tenant_id"])] = row
    return list(latest.values())


def _count(status: UsageStatus) -> Any:
    return func.sum(case((UsageRecord.status == status, 1), else_=0))


def record_count_columns() -> list[Any]:
    """Aggregates over usage records: how many, how many completed, failed and cancelled, and
    their prompt, completion and cached token sums (in `UsageSums`'s and `DailyUsage`'s order)."""
    return [
        func.count(),
        _count(UsageStatus.COMPLETED),
        _count(UsageStatus.FAILED),
        _count(UsageStatus.CANCELLED),
        func.sum(UsageRecord.prompt_tokens),
        func.sum(UsageRecord.completion_tokens),
        func.sum(UsageRecord.cached_tokens),
    ]


def within_days(query: Select[Any], day: Any, since: dt.date | None, until: dt.date | None) -> Select[Any]:
    """`query` limited to the days from `since` to `until` (both included; None: unbounded) of
    its `day` column."""
    if since is not None:
        query = query.where(day >= since)
    if until is not None:
        query = query.where(day <= until)
    return query


def daily_usage_query(
    tenant_id: int, since: dt.date | None, until: dt.date | None, endpoint: str | None = None
) -> Select[Any]:
    """One row per UTC day with records (of `endpoint` only, when given), oldest first; read
    them with `daily_usage`."""
    query = (
        select(UsageRecord.day, *record_count_columns())
        .where(UsageRecord.tenant_id == tenant_id)
        .group_by(UsageRecord.day)
        .order_by(UsageRecord.day)
    )
    if endpoint is not None:
        query = query.where(UsageRecord.endpoint == endpoint)
    return within_days(query, UsageRecord.day, since, until)


def daily_usage(row: Sequence[Any]) -> DailyUsage:
    """A row of `daily_usage_query` (sums arrive as int or Decimal depending on the backend)."""
    day, n, completed, failed, cancelled, prompt, completion, cached = row
    return DailyUsage(
        day=day,
        num_requests=int(n),
        num_completed=int(completed),
        num_failed=int(failed),
        num_cancelled=int(cancelled),
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        cached_tokens=int(cached),
    )
