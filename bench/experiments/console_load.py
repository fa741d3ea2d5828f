"""The admin console at scale (issue 26's target): 1,000 tenants and 1,000,000 usage records.

Fills a fresh database (SQLite in --out by default; `--db-url "$WEIR_TEST_PG_URL"` for an empty
PostgreSQL database) through the migrations: tenants and one key each through `TenancyRepo`, then
the usage records in bulk (SQLAlchemy Core, 20,000 rows a statement), spread over 90 days with a
skewed share per tenant (tenant i gets a share proportional to 1/(i+1): the first is the heaviest).

On PostgreSQL it then runs ANALYZE, as autovacuum does shortly after a bulk load. Then measures, in-process (Starlette's TestClient over the console's routes: server time, no
network), each page's first load and the median of `--repeats` more loads, for the heaviest tenant
and a median one; and the chart queries alone (`usage_by_day` over 30 and 90 days, the usage
report grouped by key and by user). The target: each page's first load <= 300 ms of server time,
each chart query <= 200 ms.

With --compare-raw, also the heaviest tenant's chart queries over the raw records (the statements
the rollups of migration 0010 replaced), in the same run, for a ratio.

Run: python -m weir_bench.experiments.console_load --out bench-out/console-load [--records 1000000]
     [--tenants 1000] [--db-url URL] [--reuse] [--compare-raw] [--time-backfill]
Writes summary.json and summary.md in --out. Bounded: the record count is fixed, the loads are
`--repeats` + 1 per page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text
from starlette.applications import Starlette
from starlette.testclient import TestClient

from weir.gateway.console.routes import ConsoleDeps, console_routes
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.auth import Authenticator
from weir.gateway.http.auth_settings import AuthSettings
from weir.gateway.http.errors import exception_handlers
from weir.gateway.http.failure_throttle import FailureThrottle
from weir.migrations.migrate import downgrade, upgrade
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import Tenant, UsageRecord
from weir.tenancy.usage.usage import daily_usage, daily_usage_query
from weir.tenancy.usage.usage_report import ReportQuery, build_report, page_statement, totals_statement

TOKEN = "console-load-admin-token"
BATCH = 20_000
DAYS = 90
USERS = 200
PAGE_TARGET_MS = 300.0
QUERY_TARGET_MS = 200.0


def fill(repo: TenancyRepo, num_tenants: int, num_records: int) -> tuple[list[str], dict[str, str]]:
    """Tenants t0000.. with one key each, then the records; returns the names and key ids."""
    names = [f"t{i:04d}" for i in range(num_tenants)]
    keys: dict[str, str] = {}
    for name in names:
        repo.create_tenant(TenantSpec(name), actor="bench")
        keys[name] = repo.issue_key(name, KeySpec(), actor="bench").view.id
    with repo.db.engine.connect() as conn:
        ids: dict[str, int] = {name: id_ for name, id_ in conn.execute(select(Tenant.name, Tenant.id))}
    weights = [1.0 / (i + 1) for i in range(num_tenants)]
    total = sum(weights)
    counts = [int(num_records * w / total) for w in weights]
    counts[0] += num_records - sum(counts)
    now = repo.now()
    table = UsageRecord.__table__
    rows: list[dict[str, Any]] = []
    n = 0
    with repo.db.engine.begin() as conn:
        for name, count in zip(names, counts, strict=True):
            for j in range(count):
                created = now - dt.timedelta(seconds=(n * 7919) % (DAYS * 86400))
                rows.append(
                    {
                        "request_id": f"r{n}",
                        "tenant_id": ids[name],
                        "key_id": keys[name],
                        "model": "m",
                        "model_version": f"m@v{1 + j % 2}",
                        "adapter": None,
                        "prompt_tokens": 50 + n % 200,
                        "completion_tokens": 10 + n % 100,
                        "cached_tokens": 0,
                        "ttft_ms": 50.0,
                        "e2e_ms": 500.0,
                        "status": UsageStatus.COMPLETED,
                        "finish_reason": None,
                        "created_at": created,
                        "day": created.date(),
                        "user": f"user{n % USERS}",
                    }
                )
                n += 1
                if len(rows) == BATCH:
                    conn.execute(insert(table), rows)
                    rows = []
        if rows:
            conn.execute(insert(table), rows)
    return names, keys


def timed(call: Callable[[], Any], repeats: int) -> dict[str, float]:
    """The first call's time and the median of `repeats` more, in ms."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return {"first_ms": round(times[0], 1), "median_ms": round(statistics.median(times[1:]), 1)}


def measure_pages(
    repo: TenancyRepo, tenants: dict[str, str], keys: dict[str, str], repeats: int
) -> dict[str, Any]:
    throttle = FailureThrottle(20, 60.0)
    deps = ConsoleDeps(
        repo, Authenticator(repo, AuthSettings()), AdminAuthenticator(repo, TOKEN, throttle=throttle), dict
    )
    app = Starlette(routes=console_routes(deps), exception_handlers=exception_handlers())
    results: dict[str, Any] = {}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        form = client.get("/admin/ui/login").text
        match = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert match is not None
        answer = client.post("/admin/ui/login", data={"token": TOKEN, "csrf_token": match.group(1)})
        assert answer.status_code == 200, answer.status_code
        since90 = (repo.now().date() - dt.timedelta(days=DAYS - 1)).isoformat()
        pages = {
            "tenants (first page of 100)": "/admin/ui/tenants",
            "audit": "/admin/ui/audit",
            "engine": "/admin/ui/engine",
        }
        for label, name in tenants.items():
            pages[f"tenant {label}"] = f"/admin/ui/tenants/{name}"
            pages[f"key {label}"] = f"/admin/ui/keys/{keys[name]}"
            pages[f"usage {label} (30 d, by key)"] = f"/admin/ui/usage?tenant={name}"
            pages[f"usage {label} (90 d, by user)"] = (
                f"/admin/ui/usage?tenant={name}&since={since90}&group_by=user"
            )
            pages[f"usage.csv {label} (90 d)"] = f"/admin/ui/usage.csv?tenant={name}&since={since90}"
        for label, path in pages.items():

            def load(path: str = path) -> None:
                response = client.get(path)
                assert response.status_code == 200, (path, response.status_code)

            results[label] = timed(load, repeats)
    return results


def measure_queries(repo: TenancyRepo, tenants: dict[str, str], repeats: int) -> dict[str, Any]:
    today = repo.now().date()
    results: dict[str, Any] = {}
    for label, name in tenants.items():
        for days in (30, DAYS):
            since = today - dt.timedelta(days=days - 1)
            results[f"usage_by_day {label} {days} d"] = timed(
                lambda name=name, since=since: repo.usage_by_day(name, since=since, until=today), repeats
            )
        for group in ("key", "user"):
            query = ReportQuery(
                since=dt.datetime.combine(today - dt.timedelta(days=DAYS - 1), dt.time(), dt.UTC),
                until=dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), dt.UTC),
                group_by=(group,),
                tenant=name,
                limit=50,
            )
            results[f"usage_report by {group} {label} {DAYS} d"] = timed(
                lambda query=query: repo.usage_report(query), repeats
            )
    return results


def measure_raw(repo: TenancyRepo, name: str, repeats: int) -> dict[str, Any]:
    """The heaviest tenant's chart queries read from the raw records (the statements before the
    rollups of migration 0010), beside `measure_queries`'s, for a ratio in one run."""
    today = repo.now().date()
    since = today - dt.timedelta(days=DAYS - 1)
    with repo.db.transaction() as session:
        tenant_id = session.scalars(select(Tenant.id).where(Tenant.name == name)).one()

    def by_day() -> None:
        with repo.db.transaction() as session:
            for row in session.execute(daily_usage_query(tenant_id, since, today)):
                daily_usage(row)

    results: dict[str, Any] = {f"usage_by_day heaviest {DAYS} d (raw records)": timed(by_day, repeats)}
    for group in ("key", "user"):
        query = ReportQuery(
            since=dt.datetime.combine(since, dt.time(), dt.UTC),
            until=dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), dt.UTC),
            group_by=(group,),
            tenant=name,
            limit=50,
        )

        def report(query: ReportQuery = query) -> None:
            with repo.db.transaction() as session:
                page = list(session.execute(page_statement(query, tenant_id)))
                build_report(query, page, session.execute(totals_statement(query, tenant_id)).one())

        results[f"usage_report by {group} heaviest {DAYS} d (raw records)"] = timed(report, repeats)
    return results


def time_backfill(db: Database) -> dict[str, Any]:
    """Migration 0010 on the filled database: down to 0009 (drops the rollups), up again (fills
    them from the records); whether the rollups' sums came back the same."""
    sums = text("SELECT SUM(requests), SUM(prompt_tokens), SUM(spend_micros) FROM usage_daily_users")
    with db.engine.connect() as conn:
        before = tuple(conn.execute(sums).one())
    start = time.perf_counter()
    downgrade(db.engine, "0009")
    down_s = time.perf_counter() - start
    start = time.perf_counter()
    upgrade(db.engine)
    up_s = time.perf_counter() - start
    with db.engine.connect() as conn:
        same = tuple(conn.execute(sums).one()) == before
    return {"downgrade_s": round(down_s, 1), "upgrade_backfill_s": round(up_s, 1), "sums_equal": same}


def _table(title: str, rows: dict[str, dict[str, float]], target: float) -> list[str]:
    lines = [
        f"### {title} (target: first load <= {target:.0f} ms)",
        "",
        "| what | first (ms) | median (ms) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k} | {v['first_ms']} | {v['median_ms']} |" for k, v in rows.items()]
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench-out/console-load"))
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db-url", default=None, help="an empty database (default: SQLite in --out)")
    parser.add_argument("--reuse", action="store_true", help="measure the database a previous run filled")
    parser.add_argument(
        "--time-backfill", action="store_true", help="finally time migration 0010 down and up (its backfill)"
    )
    parser.add_argument(
        "--compare-raw",
        action="store_true",
        help="also time the heaviest tenant's queries over the raw records",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    url = args.db_url
    if url is None:
        path = args.out / "console-load.db"
        if not args.reuse:
            path.unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    db = Database(url)
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"bench"))
    start = time.perf_counter()
    if args.reuse:
        names = repo.tenant_names()
        keys = {name: repo.list_keys(name)[0].id for name in (names[0], names[len(names) // 2])}
        args.tenants = len(names)
    else:
        names, keys = fill(repo, args.tenants, args.records)
    fill_s = time.perf_counter() - start
    print(f"filled {args.tenants} tenants, {args.records} records in {fill_s:.0f} s", flush=True)
    if db.engine.dialect.name == "postgresql":
        # What autovacuum does within a minute of a bulk load: without statistics the planner
        # reads the fresh tables blind (e.g. scans a whole rollup instead of one tenant's rows).
        with db.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    tenants = {"heaviest": names[0], "median": names[len(names) // 2]}
    pages = measure_pages(repo, tenants, keys, args.repeats)
    queries = measure_queries(repo, tenants, args.repeats)
    if args.compare_raw:
        queries.update(measure_raw(repo, tenants["heaviest"], args.repeats))
    backfill = time_backfill(db) if args.time_backfill else None
    db.dispose()
    summary = {
        "dialect": db.engine.dialect.name,
        "tenants": args.tenants,
        "records": args.records,
        "records_heaviest_tenant": None,
        "fill_s": round(fill_s, 1),
        "pages": pages,
        "chart_queries": queries,
        "backfill": backfill,
    }
    weights = [1.0 / (i + 1) for i in range(args.tenants)]
    summary["records_heaviest_tenant"] = int(args.records * weights[0] / sum(weights))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    md = [
        f"## Console at scale: {args.tenants} tenants, {args.records} usage records ({summary['dialect']})",
        "",
        f"Heaviest tenant: ~{summary['records_heaviest_tenant']} records; server time in-process.",
        "",
        *_table("Pages", pages, PAGE_TARGET_MS),
        *_table("Chart queries", queries, QUERY_TARGET_MS),
    ]
    if backfill is not None:
        md += [f"Migration 0010 on this database: {backfill}", ""]
    (args.out / "summary.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
