"""Prometheus metrics of the usage-record writer and its disk spool, read at scrape time.

`weir_usage_records_pending` is the number to watch: records served and accepted but not yet in
the database (in memory, or fsync'd in the spool while the database is down). It returns to 0
when the database has caught up; `weir_usage_records_dropped_total` must stay 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.gateway.metrics.scrape_families import SnapshotCollector, unlabelled

if TYPE_CHECKING:
    from weir.tenancy.usage.usage_writer import UsageWriterStats


class UsageRecordsCollector(SnapshotCollector["UsageWriterStats"]):
    """Pending, spooled, written, replayed, rejected, dropped and corrupt usage records."""

    def __init__(self, stats: Callable[[], UsageWriterStats]) -> None:
        super().__init__(stats, usage_records_metrics)


def usage_records_metrics(s: UsageWriterStats) -> Iterator[Metric]:
    """The usage writer's families of one snapshot of its counts."""
    yield GaugeMetricFamily(
        "weir_usage_records_pending",
        "Usage records accepted but not yet in the database (in memory or in the disk spool).",
        value=s.num_pending,
    )
    yield GaugeMetricFamily(
        "weir_usage_database_available",
        "1 unless the last usage write found the database unavailable.",
        value=1 if s.database_available else 0,
    )
    counters = (
        ("weir_usage_records_spooled", "Usage records fsync'd to the disk spool.", s.num_spooled),
        ("weir_usage_records_written", "Usage records committed to the database.", s.num_written),
        (
            "weir_usage_records_replayed",
            "Usage records written from the spool after a database outage or a restart.",
            s.num_replayed,
        ),
        (
            "weir_usage_records_rejected",
            "Usage records the database refused for good (kept in the spool's rejected.jsonl).",
            s.num_rejected,
        ),
        (
            "weir_usage_records_dropped",
            "Usage records lost: the in-memory queue was full.",
            s.num_dropped,
        ),
        (
            "weir_usage_spool_corrupt_lines",
            "Spool lines skipped because they did not decode (a torn write at a crash).",
            s.num_corrupt,
        ),
    )
    yield from unlabelled(CounterMetricFamily, counters)
