"""The console's usage pages: tokens per day for a tenant (chart, table, CSV) over a range."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from gateway.console.base import (
    CONSOLE_ERRORS,
    SECURITY_HEADERS,
    ConsoleBase,
)
from gateway.console.sessions import ConsoleSession
from gateway.errors import to_http_error
from tenancy.admin_codec import (
    parse_date,
)
from tenancy.records import DailyUsage

_USAGE_DAYS = 30


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


class UsagePages(ConsoleBase):
    # -- usage ------------------------------------------------------------------------------------

    async def _usage(
        self, request: Request
    ) -> tuple[str | None, dt.date, dt.date, list[DailyUsage], list[str]]:
        tenants = [t.name for t in await run_in_threadpool(self.repo.list_tenants)]
        tenant = request.query_params.get("tenant") or (tenants[0] if tenants else None)
        today = self.repo.now().date()
        since_raw, until_raw = request.query_params.get("since"), request.query_params.get("until")
        since = parse_date(since_raw, "since") if since_raw else today - dt.timedelta(days=_USAGE_DAYS - 1)
        until = parse_date(until_raw, "until") if until_raw else today
        days: list[DailyUsage] = []
        if tenant is not None:
            days = await run_in_threadpool(lambda: self.repo.usage_by_day(tenant, since=since, until=until))
        return tenant, since, until, days, tenants

    async def usage(self, request: Request, session: ConsoleSession) -> Response:
        try:
            tenant, since, until, days, tenants = await self._usage(request)
        except CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        return self.render(
            "usage.html",
            200,
            session,
            nav="usage",
            tenant=tenant or "",
            tenants=tenants,
            since=since.isoformat(),
            until=until.isoformat(),
            days=days,
            bars=usage_chart(days),
        )

    async def usage_csv(self, request: Request, session: ConsoleSession) -> Response:
        try:
            tenant, since, until, days, _ = await self._usage(request)
        except CONSOLE_ERRORS as exc:
            http = to_http_error(exc)
            return self.render("error.html", http.status_code, session, error=http.message, nav="usage")
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            [
                "tenant",
                "day",
                "requests",
                "completed",
                "failed",
                "cancelled",
                "prompt_tokens",
                "completion_tokens",
                "cached_tokens",
            ]  # fmt: skip
        )
        for d in days:
            writer.writerow(
                [
                    tenant,
                    d.day.isoformat(),
                    d.num_requests,
                    d.num_completed,
                    d.num_failed,
                    d.num_cancelled,
                    d.prompt_tokens,
                    d.completion_tokens,
                    d.cached_tokens,
                ]  # fmt: skip
            )
        filename = f"weir-usage-{tenant}-{since.isoformat()}-{until.isoformat()}.csv"
        return Response(
            out.getvalue(),
            media_type="text/csv",
            headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{filename}"'},
        )
