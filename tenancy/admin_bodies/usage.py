"""Usage answers: a tenant's usage per UTC day (`GET /admin/v1/tenants/{name}/usage`, the
tenant's own `GET /v1/usage`) and the grouped report (`GET /admin/v1/usage/report`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.admin_bodies.fields import Day, TenantName
from weir.tenancy.usage.usage_records import DailyUsage
from weir.tenancy.usage.usage_report import MEASURES, UsageReport, UsageSums


class UsageTotals(BaseModel):
    """Requests by outcome and tokens."""

    # model_validate(sums) of a `UsageSums`.
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    requests: int
    completed: int
    failed: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int


class ReportTotals(UsageTotals):
    """The report's sums: requests and tokens, and the spend of its records."""

    spend_micros: int = Field(description="micro-units of the report's currency; unpriced records add 0")
    unpriced: int = Field(description="records without a price (their model had none when they were made)")


class TenantUsageDay(UsageTotals):
    """One UTC day."""

    day: Day


class TenantUsage(BaseModel):
    """A tenant's usage per UTC day plus the total over the days shown."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["usage"] = "usage"
    tenant: TenantName
    data: list[TenantUsageDay]
    total: UsageTotals

    @classmethod
    def of(cls, tenant: str, days: Sequence[DailyUsage]) -> TenantUsage:
        sums = [UsageSums(*d.counts()) for d in days]
        total = UsageSums(*(sum(getattr(s, f) for s in sums) for f in MEASURES if f != "total_tokens"))
        return cls(
            tenant=tenant,
            data=[
                TenantUsageDay(day=d.day, **dict(UsageTotals.model_validate(s)))
                for d, s in zip(days, sums, strict=True)
            ],
            total=UsageTotals.model_validate(total),
        )


class UsageReportRow(ReportTotals):
    """One group: its dimensions (only those grouped by are present; null: none recorded) and sums."""

    tenant: str | None = None
    key_id: str | None = None
    model: str | None = None
    model_version: str | None = None
    user: str | None = None
    adapter: str | None = None
    endpoint: str | None = Field(
        default=None, description="chat.completion, text_completion, message, response, tokenize"
    )
    day: str | None = Field(default=None, description="YYYY-MM-DD (UTC)")
    hour: str | None = Field(default=None, description="YYYY-MM-DDTHH:00:00Z")


class UsageReportBody(BaseModel):
    """`GET /admin/v1/usage/report` in JSON: one page of groups and the whole range's totals."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["usage_report"] = "usage_report"
    since: str
    until: str
    group_by: list[str]
    tenant: str | None
    key_id: str | None
    endpoint: str | None = None
    limit: int
    offset: int
    next_offset: int | None
    has_more: bool
    data: list[UsageReportRow]
    totals: ReportTotals
    currency: str | None = Field(description="of the spend (one per deployment); null: nothing priced")

    @classmethod
    def of(cls, report: UsageReport) -> UsageReportBody:
        q = report.query
        return cls(
            since=q.since.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
            until=q.until.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
            group_by=list(q.group_by),
            tenant=q.tenant,
            key_id=q.key_id,
            endpoint=q.endpoint,
            limit=q.limit,
            offset=q.offset,
            next_offset=report.next_offset,
            has_more=report.next_offset is not None,
            data=[
                UsageReportRow.model_validate({**r.group, **dict(ReportTotals.model_validate(r.sums))})
                for r in report.rows
            ],
            totals=ReportTotals.model_validate(report.totals),
            currency=report.currency,
        )

    def json_body(self) -> dict[str, Any]:
        """The JSON answer (a row carries only the dimensions grouped by)."""
        body = self.model_dump(mode="json", exclude={"data"})
        body["data"] = [r.model_dump(mode="json", exclude_unset=True) for r in self.data]
        return body
