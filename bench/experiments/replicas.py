"""Two `weir serve` replicas on one PostgreSQL under the mixed trace: budgets, revocation, usage.

Starts two real `weir serve` processes (a random 2-layer Llama with SmolLM2's tokenizer, or
--model) on a fresh schema of the PostgreSQL at --database-url, creates the trace's tenants with
a daily token budget each (no refill during the run, so the bound is exact) and replays
`mixed.jsonl` as a closed loop (--concurrency requests in flight, request i to replica i % 2,
bounded by --limit and --max-duration-s). Midway, a probe key is revoked through replica A, and
replica B is polled until it refuses the key. After both replicas stopped (each drains and
returns its leases), it compares, per tenant:

- overshoot: tokens answered minus the budget (the target: at most one lease per replica);
- usage: the tokens the responses reported against the usage records in the database (exact);
- the budget left in the database against the budget minus the tokens answered (exact);

and the revocation delay on replica B against --auth-cache-ttl-s. Writes summary.json and
summary.md to --out.

Run: python -m weir_bench.experiments.replicas --database-url postgresql+psycopg://... --out bench-out/replicas
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from weir.engine.request import Priority
from weir.migrations.migrate import upgrade
from weir.tenancy.budgets.leases import LeaseStore
from weir.tenancy.context import QuotaLimits
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir_bench.loadgen import BodyOptions, request_body
from weir_bench.replica_set import revoke_key, run_replicas
from weir_bench.weir_process import resolve_model
from weir_bench.workloads import WorkloadRequest, load_trace, take

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT.parent / "shared" / "workloads"
PEPPER = "replica-experiment-pepper"
PROBE = "probe"  # the tenant whose key is revoked midway
SERVED = "tiny"


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    """A throw-away schema of the database at `base_url`, migrated; its URL."""
    schema = f"replicas_{uuid.uuid4().hex[:12]}"
    admin = Database(base_url)
    with admin.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{base_url}?options=-csearch_path%3D{schema}"
    try:
        db = Database(url)
        upgrade(db.engine)  # `weir serve` never migrates PostgreSQL
        db.dispose()
        yield url
    finally:
        with admin.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _body(req: WorkloadRequest) -> dict[str, Any]:
    body = request_body(req, SERVED, BodyOptions())
    body["stream"] = False
    body.pop("stream_options", None)
    return body


def _send(client: httpx.Client, req: WorkloadRequest, key: str) -> dict[str, Any]:
    response = client.post(req.kind.path, json=_body(req), headers={"authorization": f"Bearer {key}"})
    usage = response.json().get("usage") if response.status_code == 200 else None
    return {
        "tenant": req.tenant,
        "status": response.status_code,
        "tokens": usage["total_tokens"] if usage else 0,
    }


def _revocation_delay(replicas: list[Any], key: str, key_id: str, ttl_s: float) -> dict[str, Any]:
    """Revoke through replica A; poll B (which has the key cached) until it refuses."""
    body = {"model": SERVED, "prompt": "ping", "max_tokens": 1}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60) as client:
        warm = client.post(replicas[1].url + "/v1/completions", json=body, headers=headers).status_code
        revoke_key(replicas[0], key_id)
        revoked_at = time.monotonic()
        on_a = client.post(replicas[0].url + "/v1/completions", json=body, headers=headers).status_code
        on_b, served_after = 200, 0
        while time.monotonic() - revoked_at < ttl_s + 10:  # bounded: the TTL and a margin
            on_b = client.post(replicas[1].url + "/v1/completions", json=body, headers=headers).status_code
            if on_b != 200:
                break
            served_after += 1
            time.sleep(0.1)
        delay_s = time.monotonic() - revoked_at
    return {
        "warm_status_on_b": warm,
        "status_on_a_at_once": on_a,
        "status_on_b_at_end": on_b,
        "delay_on_b_s": round(delay_s, 2),
        "auth_cache_ttl_s": ttl_s,
        "served_on_b_after_revocation": served_after,
        "within_ttl": on_a == 401 and on_b == 401 and delay_s <= ttl_s + 1.0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    trace = take(load_trace(args.workload), args.limit)
    tenants = sorted({r.tenant for r in trace})
    limits = QuotaLimits(tokens_per_day=args.budget_tokens)
    model = resolve_model(args.model, args.out / "work")
    flags = ["--served-model-name", SERVED, "--lease-tokens", str(args.lease_tokens)]
    flags += [
        "--auth-cache-ttl-s",
        str(args.auth_cache_ttl_s),
        "--kv-cache-tokens",
        str(args.kv_cache_tokens),
    ]
    flags += ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", "256"]
    with fresh_schema(args.database_url) as url:
        db = Database(url)
        repo = TenancyRepo(db, KeyHasher.from_pepper(PEPPER))
        keys = {}
        for name in tenants:
            # The most urgent priority class the tenant's requests ask for (a higher one is refused).
            asked = {Priority[r.priority.upper()] for r in trace if r.tenant == name and r.priority}
            priority = min(asked, default=Priority.STANDARD)
            repo.create_tenant(TenantSpec(name=name, priority=priority, quota=limits), actor="bench")
            keys[name] = repo.issue_key(name, KeySpec(), actor="bench").key
        repo.create_tenant(TenantSpec(name=PROBE), actor="bench")
        probe = repo.issue_key(PROBE, KeySpec(), actor="bench")
        results: list[dict[str, Any]] = []
        revocation: dict[str, Any] = {}
        started = time.monotonic()
        with run_replicas(model, url, PEPPER, args.out / "work", flags=flags) as replicas:
            clients = [httpx.Client(base_url=r.url, timeout=args.timeout_s) for r in replicas]
            deadline = started + args.max_duration_s

            def one(i: int) -> dict[str, Any] | None:
                if time.monotonic() > deadline:
                    return None  # bounded in time as well as in count
                if i == len(trace) // 2:
                    revocation.update(
                        _revocation_delay(replicas, probe.key, probe.view.id, args.auth_cache_ttl_s)
                    )
                return _send(clients[i % 2], trace[i], keys[trace[i].tenant])

            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                results = [r for r in pool.map(one, range(len(trace))) if r is not None]
            for c in clients:
                c.close()
        duration_s = time.monotonic() - started
        per_tenant = {}
        for name in tenants:
            mine = [r for r in results if r["tenant"] == name]
            answered = sum(r["tokens"] for r in mine)
            days = repo.usage_by_day(name)
            recorded = sum(d.total_tokens for d in days)
            state = LeaseStore(db).state(name, limits)
            remaining = state.day_remaining if state is not None else None
            per_tenant[name] = {
                "requests": len(mine),
                "answered_200": sum(r["status"] == 200 for r in mine),
                "refused_429": sum(r["status"] == 429 for r in mine),
                "other_status": sorted({r["status"] for r in mine} - {200, 429}),
                "budget_tokens": args.budget_tokens,
                "tokens_answered": answered,
                "overshoot_tokens": answered - args.budget_tokens,
                "overshoot_bound_tokens": 2 * args.lease_tokens,
                "tokens_recorded_in_db": recorded,
                "usage_exact": recorded == answered,
                "budget_left_in_db": remaining,
                "budget_exact": remaining == args.budget_tokens - answered,
            }
        db.dispose()
    return {
        "workload": str(args.workload),
        "requests_sent": len(results),
        "duration_s": round(duration_s, 1),
        "replicas": 2,
        "lease_tokens": args.lease_tokens,
        "tenants": per_tenant,
        "revocation": revocation,
    }


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"Two replicas, {summary['requests_sent']} requests of {Path(summary['workload']).name} in "
        f"{summary['duration_s']} s, lease {summary['lease_tokens']} tokens",
        "",
        "| tenant | 200 | 429 | budget | answered | overshoot (bound) | recorded in DB | budget left (exact) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in summary["tenants"].items():
        lines.append(
            f"| {name} | {t['answered_200']} | {t['refused_429']} | {t['budget_tokens']} | {t['tokens_answered']} "
            f"| {t['overshoot_tokens']} (<= {t['overshoot_bound_tokens']}) | {t['tokens_recorded_in_db']} "
            f"({'exact' if t['usage_exact'] else 'DIFFERS'}) | {t['budget_left_in_db']} "
            f"({'exact' if t['budget_exact'] else 'DIFFERS'}) |"
        )
    rev = summary["revocation"]
    if rev:
        lines += [
            "",
            f"Revocation through replica A: A answered {rev['status_on_a_at_once']} at once; B answered "
            f"{rev['status_on_b_at_end']} after {rev['delay_on_b_s']} s (auth cache TTL {rev['auth_cache_ttl_s']} s, "
            f"{rev['served_on_b_after_revocation']} requests served meanwhile from its cache).",
        ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.replicas", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--database-url", required=True, help="PostgreSQL (e.g. WEIR_TEST_PG_URL of .ci/postgres.sh)"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--model", type=Path, help="model folder (default: a random 2-layer Llama, SmolLM2's tokenizer)"
    )
    p.add_argument("--workload", type=Path, default=WORKLOADS / "mixed.jsonl")
    p.add_argument("--limit", type=int, help="only the first N requests of the trace")
    p.add_argument("--budget-tokens", type=int, default=3000, help="each tenant's tokens_per_day")
    p.add_argument("--lease-tokens", type=int, default=200)
    p.add_argument("--auth-cache-ttl-s", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--kv-cache-tokens", type=int, default=16_384)
    p.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    p.add_argument("--max-duration-s", type=float, default=600.0, help="no request starts after this")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = run(args)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = render(summary)
    (args.out / "summary.md").write_text(table)
    print(table)
    ok = all(
        not t["other_status"]
        and t["usage_exact"]
        and t["budget_exact"]
        and t["overshoot_tokens"] <= t["overshoot_bound_tokens"]
        for t in summary["tenants"].values()
    )
    return 0 if ok and summary["revocation"].get("within_ttl") else 1


if __name__ == "__main__":
    sys.exit(main())
