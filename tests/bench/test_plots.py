"""weir_bench.plots: the PNGs exist, are valid, and matplotlib reads them back."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from weir_bench.plots import LATENCY_CDF_FILE, THROUGHPUT_FILE, throughput_series, write_plots
from weir_bench.records import RequestRecord

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plots_are_valid_pngs(tmp_path: Path, sample_records: list[RequestRecord]) -> None:
    paths = write_plots(sample_records, tmp_path, title="test")
    assert [p.name for p in paths] == [LATENCY_CDF_FILE, THROUGHPUT_FILE]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(p)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_plots_of_a_run_without_data(tmp_path: Path, sample_records: list[RequestRecord]) -> None:
    failed_only = [r for r in sample_records if not r.ok]
    for p in write_plots(failed_only, tmp_path):
        assert p.read_bytes()[:8] == PNG_SIGNATURE


def test_throughput_series_counts_usage_tokens(sample_records: list[RequestRecord]) -> None:
    starts, tok_s, req_s = throughput_series(sample_records, bin_s=0.5)
    assert starts[:3] == [0.0, 0.5, 1.0]
    assert sum(tok_s) * 0.5 == pytest.approx(6 * 5 + 3)  # every output token lands in some bin
    assert sum(req_s) * 0.5 == pytest.approx(6)  # completed requests only
    with pytest.raises(ValueError, match="bin_s"):
        throughput_series(sample_records, 0.0)
