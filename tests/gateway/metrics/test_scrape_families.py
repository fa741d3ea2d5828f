"""The pieces of the scrape-time families: a snapshot read once per scrape (nothing when the read
raises), a family of one label, and a table of unlabelled families."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.gateway.metrics.scrape_families import SnapshotCollector, labelled, unlabelled


def _families(n: int) -> Iterator[Metric]:
    yield GaugeMetricFamily("weir_test_n", "n.", value=n)


def test_the_snapshot_is_read_once_per_scrape() -> None:
    reads: list[int] = []

    def read() -> int:
        reads.append(len(reads))
        return 7

    (family,) = SnapshotCollector(read, _families).collect()
    assert reads == [0]
    assert family.samples[0].value == 7


def test_a_read_that_raises_yields_nothing() -> None:
    def read() -> int:
        raise RuntimeError("engine down")

    assert list(SnapshotCollector(read, _families).collect()) == []


def test_a_labelled_family_has_one_sample_per_label_value() -> None:
    family = labelled(CounterMetricFamily, "weir_test_blocks", "Blocks.", "result", [("hit", 3), ("miss", 1)])
    assert family.type == "counter"
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("weir_test_blocks_total", {"result": "hit"}, 3),
        ("weir_test_blocks_total", {"result": "miss"}, 1),
    ]


def test_unlabelled_families_one_per_row() -> None:
    families = list(unlabelled(GaugeMetricFamily, [("weir_test_a", "A.", 1.5), ("weir_test_b", "B.", 2)]))
    assert [(f.name, f.documentation, f.type, f.samples[0].value) for f in families] == [
        ("weir_test_a", "A.", "gauge", 1.5),
        ("weir_test_b", "B.", "gauge", 2),
    ]
