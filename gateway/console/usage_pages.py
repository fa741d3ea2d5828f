"""The console's usage pages: tokens per day for a tenant (chart, table, CSV) over a range."""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from weir.gateway.console.base import (
    CONSOLE_ERRORS,
    SECURITY_HEADERS,
    ConsoleBase,
)
from weir.gateway.console.sessions import ConsoleSession
from weir.gateway.http.errors import to_http_error
from weir.tenancy.admin_bodies.fields import parse_date
from weir.tenancy.errors import FieldError
from weir.tenancy.usage.usage_records import COUNT_MEASURES, DailyUsage
from weir.tenancy.usage.usage_report import ReportQuery, ReportRow

_USAGE_DAYS = 30
BREAKDOWNS = ("key", "model", "model_version", "user")  # the usage page's "by" choices
_BREAKDOWN_ROWS = 50


@dataclass(frozen=True)
class UsageView:
    """What the usage page shows for one tenant and range: per day, and broken down by one field."""

    tenant: str | None
    since: dt.date
    until: dt.date
    days: list[DailyUsage]
    tenants: list[str]
    group_by: str
    breakdown: list[ReportRow]
    more: bool  # the breakdown has more groups than shown


def breakdown_chart(rows: list[ReportRow], width: int = 600) -> list[dict[str, Any]]:
    """Horizontal bars (one per group, 22 px apart) of total tokens, scaled to the largest."""
    top = max((r.sums.total_tokens for r in rows), default=0) or 1
    return [
        {
            "y": 22 * i,
            "width": round(width * r.sums.total_tokens / top, 1),
            "label": f"{next(iter(r.group.values())) or '(none)'}: {r.sums.total_tokens} tokens",
        }
        for i, r in enumerate(rows)
    ]


def usage_chart(days: list[DailyUsage], width: int = 600, height: int = 160) -> list[dict[str, Any]]:
    """Bars (x, y, width, height, label) for tokens per day, scaled to the tallest day."""
    if not days:
        return []
    totals = [d.prompt_tokens + d.completion_tokens for d in days]
    top = max(totals) or 1
    slot = width / len(days)
    bars: list[dict[str, Any]] = []
    for d, total in zip(days, totals, strict=True):
        h = round(height * total / top, 1)
        bars.append(
            {
                "x": round(slot * len(bars) + slot * 0.1, 1),
                "y": round(height - h, 1),
                "width": round(slot * 0.8, 1),
                "height": h,
                "label": f"{d.day.isoformat()}: {total} tokens",
            }
        )
    return bars


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)


class UsagePages(ConsoleBase):
    """The usage page (chart per day, breakdown by key, model or user) and its CSV."""

    # -- usage ------------------------------------------------------------------------------------

    async def _usage(self, request: Request, with_breakdown: bool = True) -> UsageView:
        tenants = await run_in_threadpool(self.repo.tenant_names)
        tenant = request.query_params.get("tenant") or (tenants[0] if tenants else None)
        today = self.repo.now().date()
        since_raw, until_raw = request.query_params.get("since"), request.query_params.get("until")
        since = parse_date(since_raw, "since") if since_raw else today - dt.timedelta(days=_USAGE_DAYS - 1)
        until = parse_date(until_raw, "until") if until_raw else today
        group_by = request.query_params.get("group_by") or BREAKDOWNS[0]
        if group_by not in BREAKDOWNS:
            raise FieldError("group_by", f"must be one of {', '.join(BREAKDOWNS)}")
        days: list[DailyUsage] = []
        report = None
        if tenant is not None:
            days = await run_in_threadpool(lambda: self.repo.usage_by_day(tenant, since=since, until=until))
            if with_breakdown:
                query = ReportQuery(
                    since=_midnight(since),
                    until=_midnight(until + dt.timedelta(days=1)),
                    group_by=(group_by,),
                    tenant=tenant,
                    limit=_BREAKDOWN_ROWS,
                )
                report = await run_in_threadpool(self.repo.usage_report, query)
        rows = report.rows if report is not None else []
        more = report is not None and report.next_offset is not None
        return UsageView(tenant, since, until, days, tenants, group_by, rows, more)

    async def usage(self, request: Request, session: ConsoleSession) -> Response:
        try:
            view = await self._usage(request)
        except CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        return self.render(
            "usage.html",
            200,
            session,
            nav="usage",
            tenant=view.tenant or "",
            tenants=view.tenants,
            since=view.since.isoformat(),
            until=view.until.isoformat(),
            days=view.days,
            bars=usage_chart(view.days),
            group_by=view.group_by,
            breakdowns=BREAKDOWNS,
            breakdown=view.breakdown,
            breakdown_bars=breakdown_chart(view.breakdown),
            more=view.more,
        )

    async def usage_csv(self, request: Request, session: ConsoleSession) -> Response:
        try:
            view = await self._usage(request, with_breakdown=False)
            tenant, since, until, days = view.tenant, view.since, view.until, view.days
        except CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["tenant", "day", *COUNT_MEASURES])
        for d in days:
            writer.writerow([tenant, d.day.isoformat(), *d.counts()])
        filename = f"weir-usage-{tenant}-{since.isoformat()}-{until.isoformat()}.csv"
        return Response(
            out.getvalue(),
            media_type="text/csv",
            headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{filename}"'},
        )
