"""PNG plots of a run: latency CDFs and throughput over time.

Figures are built with matplotlib's object API on the Agg canvas, never through pyplot, so no
global figure state or GUI backend is involved (safe in threads, servers and CI).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from weir_bench.records import RequestRecord

LATENCY_CDF_FILE = "latency_cdf.png"
THROUGHPUT_FILE = "throughput.png"


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    data = sorted(values)
    n = len(data)
    return data, [(i + 1) / n for i in range(n)]


def _latencies(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    served = [r for r in records if r.ok]
    completed = [r for r in served if r.completed]
    return {
        "TTFT": [r.ttft_ms for r in served if r.ttft_ms is not None],
        "TPOT": [t for r in completed if (t := r.tpot_ms) is not None],
        "ITL": [x for r in served for x in r.itl_ms],
        "E2E": [r.e2e_ms for r in completed if r.e2e_ms is not None],
    }


def plot_latency_cdfs(records: Sequence[RequestRecord], path: str | Path, title: str = "") -> Path:
    """One panel per latency (TTFT, TPOT, ITL, E2E): the CDF overall and per tenant."""
    fig = Figure(figsize=(11, 8), dpi=100)
    FigureCanvasAgg(fig)
    tenants = sorted({r.tenant for r in records})
    groups = [("all", list(records))]
    if len(tenants) > 1:
        groups += [(t, [r for r in records if r.tenant == t]) for t in tenants]
    axes = fig.subplots(2, 2)
    for ax, metric in zip(axes.flat, ("TTFT", "TPOT", "ITL", "E2E"), strict=True):
        plotted = False
        for name, group in groups:
            values = _latencies(group)[metric]
            if not values:
                continue
            xs, ys = _cdf(values)
            ax.step(xs, ys, where="post", label=name, linewidth=2.0 if name == "all" else 1.0)
            plotted = True
        ax.set_title(metric)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.3)
        if plotted:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title or "Latency CDFs")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def throughput_series(
    records: Sequence[RequestRecord], bin_s: float
) -> tuple[list[float], list[float], list[float]]:
    """Bin starts, output tokens/s and finished requests/s per bin of `bin_s` seconds.

    A request's tokens are spread over its content chunks (usage count / chunks each), so a
    server sending several tokens per chunk still plots its true token rate.
    """
    if bin_s <= 0:
        raise ValueError("bin_s must be > 0")
    end = max((r.end_s for r in records), default=0.0)
    num_bins = max(1, math.ceil(end / bin_s))
    tokens = [0.0] * num_bins
    finished = [0.0] * num_bins
    for r in records:
        if r.ok and r.chunk_offsets_ms:
            per_chunk = r.output_tokens / len(r.chunk_offsets_ms)
            for off in r.chunk_offsets_ms:
                tokens[min(num_bins - 1, int((r.start_s + off / 1000.0) / bin_s))] += per_chunk
        if r.completed:
            finished[min(num_bins - 1, int(r.end_s / bin_s))] += 1
    starts = [i * bin_s for i in range(num_bins)]
    return starts, [t / bin_s for t in tokens], [f / bin_s for f in finished]


def plot_throughput(records: Sequence[RequestRecord], path: str | Path, bin_s: float | None = None) -> Path:
    """Output tokens/s and completed requests/s over the run, with in-flight requests."""
    end = max((r.end_s for r in records), default=0.0)
    # About 60 bins whatever the run length, never finer than 0.1 s.
    bin_s = bin_s or max(0.1, round(end / 60.0, 1))
    starts, tok_s, req_s = throughput_series(records, bin_s)
    fig = Figure(figsize=(11, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax_tok, ax_req = fig.subplots(2, 1, sharex=True)
    ax_tok.step(starts, tok_s, where="post", color="tab:blue")
    ax_tok.set_ylabel("output tokens/s")
    ax_tok.grid(True, alpha=0.3)
    ax_req.step(starts, req_s, where="post", color="tab:green", label="completed req/s")
    in_flight = [sum(1 for r in records if r.start_s <= t < r.end_s) for t in starts]
    ax_inflight = ax_req.twinx()
    ax_inflight.step(starts, in_flight, where="post", color="tab:orange", label="in flight")
    ax_req.set_ylabel("completed req/s")
    ax_inflight.set_ylabel("in flight (at bin start)")
    ax_req.set_xlabel(f"seconds since start (bins of {bin_s:g} s)")
    ax_req.grid(True, alpha=0.3)
    handles = ax_req.get_legend_handles_labels()[0] + ax_inflight.get_legend_handles_labels()[0]
    ax_req.legend(handles=handles, fontsize="small", loc="upper right")
    fig.suptitle("Throughput over time")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def write_plots(records: Sequence[RequestRecord], out_dir: str | Path, title: str = "") -> list[Path]:
    """Both plots into `out_dir`; returns their paths."""
    d = Path(out_dir)
    return [
        plot_latency_cdfs(records, d / LATENCY_CDF_FILE, title),
        plot_throughput(records, d / THROUGHPUT_FILE),
    ]
