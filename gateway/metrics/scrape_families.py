"""Metric families computed when Prometheus scrapes, and the pieces every such family is built of.

Weir's engine, prefix-cache and usage-writer metrics are not updated on the request path: a
collector reads a snapshot (refreshed elsewhere, about once a step or a second) when Prometheus
scrapes, and turns it into families. This module holds what those collectors share:

- `SnapshotCollector`: reads the snapshot once per scrape and hands it to a function that yields
  the families; a read that raises yields nothing, so a broken engine or writer does not break the
  scrape of everything else;
- `labelled`: a counter or gauge family of one label, one sample per (label value, value);
- `unlabelled`: one unlabelled counter or gauge family per (name, documentation, value) row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_Snapshot = TypeVar("_Snapshot")

Family = type[CounterMetricFamily] | type[GaugeMetricFamily]


class SnapshotCollector(Collector, Generic[_Snapshot]):
    """Metric families computed at scrape time from a snapshot read once per scrape.

    A read that raises yields nothing: a broken engine must not break the scrape of everything else.
    """

    def __init__(
        self, read: Callable[[], _Snapshot], families: Callable[[_Snapshot], Iterable[Metric]]
    ) -> None:
        self._read = read
        self._families = families

    def collect(self) -> Iterable[Metric]:
        try:
            snapshot = self._read()
        except Exception:
            return
        yield from self._families(snapshot)


def labelled(
    family: Family, name: str, documentation: str, label: str, values: Iterable[tuple[str, float]]
) -> Metric:
    """A `family` (counter or gauge) labelled `label`, one sample per (label value, value)."""
    metric = family(name, documentation, labels=[label])
    for label_value, value in values:
        metric.add_metric([label_value], value)
    return metric


def unlabelled(family: Family, rows: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
    """One unlabelled `family` (counter or gauge) per (name, documentation, value) row."""
    for name, documentation, value in rows:
        yield family(name, documentation, value=value)
