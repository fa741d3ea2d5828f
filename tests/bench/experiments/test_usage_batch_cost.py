"""weir_bench.experiments.usage_batch_cost: each stage of a usage-writer batch timed, its records stored."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from weir.tenancy.store.db import Database
from weir.tenancy.store.models import UsageRecord
from weir_bench.experiments import usage_batch_cost


def test_one_run_times_each_stage_and_stores_every_record(tmp_path: Path) -> None:
    report = usage_batch_cost.run(tmp_path, batch=8, reps=3, warmup=1)
    assert report["batch"] == 8 and report["reps"] == 3
    stages = report["median_cpu_ms"]
    assert set(stages) == {"spool_append", "spool_read", "record_usages"}
    assert all(ms >= 0 for ms in stages.values()) and report["batch_cpu_ms"] > 0
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    try:
        with db.engine.connect() as conn:
            num = conn.execute(select(func.count()).select_from(UsageRecord)).scalar_one()
            priced = conn.execute(
                select(func.count()).select_from(UsageRecord).where(UsageRecord.spend_micros > 0)
            ).scalar_one()
    finally:
        db.dispose()
    assert num == priced == 8 * (3 + 1)  # every batch, warm-up included, stored and priced
