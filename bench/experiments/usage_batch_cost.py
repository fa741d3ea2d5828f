"""`python -m weir_bench.experiments.usage_batch_cost`: the Python one usage-writer batch costs.

The usage writer (tenancy/usage/usage_writer.py) spools records and writes them to the database in
batches on two threads of the server's process. That work is Python: it holds the GIL, so while
a batch is written the event loop and the engine thread run at about half speed. This measures
the thread CPU (`time.thread_time`, so fsync waits do not count) of each stage of one batch on a
fresh SQLite database, as `weir serve` uses it by default: the spool's append (encode and write),
its read (decode), and `TenancyRepo.record_usages` (the tenant lookup, the prices, the upsert and
the commit). The median of `--reps` batches after `--warmup` is reported, in milliseconds.

Run it on two commits to compare (nothing else running): only its ratios on one machine count.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from weir.migrations.migrate import upgrade
from weir.tenancy.budgets.money import TokenPrices
from weir.tenancy.budgets.prices import PriceRepo, PriceSpec
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn
from weir.tenancy.usage.usage_spool import UsageSpool

MODEL = "bench-model"


def _records(num: int, key_id: str) -> list[UsageRecordIn]:
    return [
        UsageRecordIn(
            request_id=uuid.uuid4().hex,
            tenant_id="acme",
            key_id=key_id,
            model=MODEL,
            status=UsageStatus.COMPLETED,
            prompt_tokens=24,
            completion_tokens=16,
            ttft_ms=1.5,
            e2e_ms=9.0,
        )
        for _ in range(num)
    ]


def _cpu_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.thread_time()
    out = fn()
    return (time.thread_time() - start) * 1e3, out


def run(directory: Path, batch: int, reps: int, warmup: int) -> dict[str, Any]:
    db = Database(f"sqlite:///{directory / 'weir.db'}")
    upgrade(db.engine)
    repo = TenancyRepo(db, KeyHasher(b"bench-pepper"))
    repo.create_tenant(TenantSpec(name="acme"), actor="bench")
    key_id = repo.issue_key("acme", KeySpec(), actor="bench").view.id
    # A price, so the batch computes spend as a priced deployment does.
    PriceRepo(db).set_price(
        PriceSpec(model=MODEL, currency="USD", prices=TokenPrices(500_000, 250_000, 1_500_000)),
        actor="bench",
    )
    spool = UsageSpool(directory / "spool")
    spool.open()
    stages: dict[str, list[float]] = {"spool_append": [], "spool_read": [], "record_usages": []}
    for i in range(warmup + reps):
        records = _records(batch, key_id)
        append_ms, _ = _cpu_ms(lambda: spool.append(records))  # noqa: B023  (called at once)
        read_ms, spooled = _cpu_ms(lambda: spool.read(batch))
        record_ms, _ = _cpu_ms(lambda: repo.record_usages(list(spooled.records)))  # noqa: B023
        spool.commit(spooled)
        if i >= warmup:
            stages["spool_append"].append(append_ms)
            stages["spool_read"].append(read_ms)
            stages["record_usages"].append(record_ms)
    spool.close()
    db.dispose()
    medians = {name: round(statistics.median(v), 3) for name, v in stages.items()}
    return {
        "batch": batch,
        "reps": reps,
        "median_cpu_ms": medians,
        "batch_cpu_ms": round(sum(medians.values()), 3),
        "per_record_us": round(sum(medians.values()) * 1e3 / batch, 1),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.usage_batch_cost", description=__doc__.splitlines()[0]
    )
    p.add_argument("--batch", type=int, default=64, help="records a batch (the writer's max_batch)")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weir-usage-cost-") as directory:
        print(json.dumps(run(Path(directory), args.batch, args.reps, args.warmup), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
