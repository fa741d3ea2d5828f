"""The serving report: latency percentiles, throughput and goodput, overall and per tenant.

`report.json` is `{"overall": GROUP, "tenants": {name: GROUP}, "metadata": {...}}`; the key
sets below are the schema (a test pins them; add keys, never rename them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weir_bench.arrivals import ArrivalSpec
from weir_bench.loadgen import LoadOptions, LoadResult
from weir_bench.metadata import machine_info, now_utc, server_settings
from weir_bench.records import RequestRecord
from weir_bench.stats import Distribution, LatencySummary

SCHEMA_VERSION = 1
LATENCY_KEYS = ("p50", "p90", "p99", "mean")
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
GROUP_KEYS = (
    "requests",
    "ok",
    "cancelled",
    "errors_by_status",
    *LATENCY_METRICS,
    "requests_per_s",
    "output_tokens_per_s",
    "prompt_tokens",
    "output_tokens",
    "goodput",
    "good_requests",
    "slo_attainment",
)
METADATA_KEYS = (
    "schema_version",
    "date_utc",
    "command",
    "url",
    "model",
    "workload",
    "workload_sha256",
    "num_planned",
    "num_sent",
    "limit",
    "arrival",
    "slo",
    "timeout_s",
    "max_duration_s",
    "duration_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "batch_policy",
    "dtype",
    "server",
    "server_model",
    "labels",
    "tenant_keys",
    "machine",
    "git_commit",
)


@dataclass(frozen=True)
class SLO:
    """Latency objectives for goodput; None means no objective on that latency."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} SLO must be > 0")

    def met_by(self, r: RequestRecord) -> bool:
        """A completed request within both objectives (TPOT is waived for 1-token answers)."""
        if not r.completed:
            return False
        if self.ttft_ms is not None and (r.ttft_ms is None or r.ttft_ms > self.ttft_ms):
            return False
        tpot = r.tpot_ms
        return self.tpot_ms is None or tpot is None or tpot <= self.tpot_ms


@dataclass(frozen=True)
class GroupReport:
    """The figures of one group of requests (all of them, or one tenant's)."""

    requests: int
    ok: int
    cancelled: int
    errors_by_status: dict[str, int]
    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    itl_ms: LatencySummary
    e2e_ms: LatencySummary
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    output_tokens: int
    goodput: float  # requests/s that completed within the SLOs
    good_requests: int
    slo_attainment: float | None  # good_requests / requests

    @classmethod
    def of(cls, records: Sequence[RequestRecord], duration_s: float, slo: SLO) -> GroupReport:
        """Summarize `records` over a run of `duration_s` seconds.

        TTFT and ITL come from every served request (a cancelled one still had its first token
        and intervals); TPOT and E2E only from completed ones, as a cut stream shortens both.
        """
        served = [r for r in records if r.ok]
        completed = [r for r in served if r.completed]
        errors: dict[str, int] = {}
        for r in records:
            key = r.error_key
            if key is not None:
                errors[key] = errors.get(key, 0) + 1
        good = sum(1 for r in records if slo.met_by(r))
        per_s = 1.0 / duration_s if duration_s > 0 else 0.0
        output_tokens = sum(r.output_tokens for r in served)
        return cls(
            requests=len(records),
            ok=len(served),
            cancelled=sum(1 for r in served if not r.completed),
            errors_by_status=dict(sorted(errors.items())),
            ttft_ms=LatencySummary.of(r.ttft_ms for r in served if r.ttft_ms is not None),
            tpot_ms=LatencySummary.of(t for r in completed if (t := r.tpot_ms) is not None),
            itl_ms=LatencySummary.of(x for r in served for x in r.itl_ms),
            e2e_ms=LatencySummary.of(r.e2e_ms for r in completed if r.e2e_ms is not None),
            requests_per_s=len(served) * per_s,
            output_tokens_per_s=output_tokens * per_s,
            prompt_tokens=sum(r.prompt_tokens or 0 for r in served),
            output_tokens=output_tokens,
            goodput=good * per_s,
            good_requests=good,
            slo_attainment=good / len(records) if records else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The GROUP object of report.json."""
        return {
            "requests": self.requests,
            "ok": self.ok,
            "cancelled": self.cancelled,
            "errors_by_status": dict(self.errors_by_status),
            "ttft_ms": self.ttft_ms.to_json(),
            "tpot_ms": self.tpot_ms.to_json(),
            "itl_ms": self.itl_ms.to_json(),
            "e2e_ms": self.e2e_ms.to_json(),
            "requests_per_s": round(self.requests_per_s, 4),
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "goodput": round(self.goodput, 4),
            "good_requests": self.good_requests,
            "slo_attainment": None if self.slo_attainment is None else round(self.slo_attainment, 4),
        }


@dataclass(frozen=True)
class RunInfo:
    """How the run was set up: everything the metadata states besides the measurements."""

    url: str
    model: str
    workload: str
    arrival: ArrivalSpec
    options: LoadOptions
    slo: SLO = SLO()
    workload_sha256: str | None = None
    limit: int | None = None
    command: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    server_model: Mapping[str, Any] | None = None
    tenant_keys: str = "none"  # "per_tenant" | "single" | "none"
    git_commit: str | None = None


def build_report(
    result: LoadResult, info: RunInfo, machine: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """report.json as a JSON-ready dict. `machine` defaults to this machine's description."""
    records = result.records
    by_tenant: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_tenant.setdefault(r.tenant, []).append(r)
    settings = server_settings(info.server_model, info.labels)
    served = [r for r in records if r.ok]
    metadata = {
        "schema_version": SCHEMA_VERSION,
        "date_utc": now_utc(),
        "command": info.command,
        "url": info.url,
        "model": info.model,
        "workload": info.workload,
        "workload_sha256": info.workload_sha256,
        "num_planned": result.num_planned,
        "num_sent": len(records),
        "limit": info.limit,
        "arrival": info.arrival.describe(),
        "slo": {"ttft_ms": info.slo.ttft_ms, "tpot_ms": info.slo.tpot_ms},
        "timeout_s": info.options.timeout_s,
        "max_duration_s": info.options.max_duration_s,
        "duration_s": round(result.duration_s, 3),
        "prompt_tokens": Distribution.of(
            r.prompt_tokens for r in served if r.prompt_tokens is not None
        ).to_json(),
        "output_tokens": Distribution.of(r.output_tokens for r in served).to_json(),
        "max_tokens": Distribution.of(r.max_tokens for r in records).to_json(),
        "batch_policy": settings.get("batch_policy"),
        "dtype": settings.get("dtype"),
        "server": settings,
        "server_model": dict(info.server_model) if info.server_model is not None else None,
        "labels": dict(info.labels),
        "tenant_keys": info.tenant_keys,
        "machine": dict(machine) if machine is not None else machine_info(),
        "git_commit": info.git_commit,
    }
    return {
        "overall": GroupReport.of(records, result.duration_s, info.slo).to_json(),
        "tenants": {
            name: GroupReport.of(group, result.duration_s, info.slo).to_json()
            for name, group in sorted(by_tenant.items())
        },
        "metadata": metadata,
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _group_rows(name: str, group: Mapping[str, Any]) -> list[str]:
    rows = []
    for metric in LATENCY_METRICS:
        lat = group[metric]
        rows.append(f"| {name} | {metric} | " + " | ".join(_fmt(lat[k]) for k in LATENCY_KEYS) + " |")
    return rows


def render_markdown(report: Mapping[str, Any], plot_files: Sequence[str] = ()) -> str:
    """report.md: the same figures as report.json, for people."""
    meta = report["metadata"]
    lines = [
        "# Serving benchmark",
        "",
        f"- Date (UTC): {meta['date_utc']}",
        f"- Command: `{meta['command']}`",
        f"- Server: {meta['url']}, model `{meta['model']}`, batch policy {_fmt(meta['batch_policy'])}, "
        f"dtype {_fmt(meta['dtype'])}",
        f"- Workload: {meta['workload']} ({meta['num_sent']} of {meta['num_planned']} requests sent)",
        f"- Arrivals: {', '.join(f'{k}={v}' for k, v in meta['arrival'].items())}; "
        f"SLO: TTFT {_fmt(meta['slo']['ttft_ms'])} ms, TPOT {_fmt(meta['slo']['tpot_ms'])} ms",
        f"- Machine: {meta['machine'].get('cpu')}, {meta['machine'].get('cores')} cores, "
        f"{meta['machine'].get('memory_gb')} GB, {meta['machine'].get('platform')}",
        f"- Duration: {meta['duration_s']} s",
        "",
        "## Throughput",
        "",
        "| group | requests | ok | cancelled | errors | req/s | output tok/s | goodput req/s | SLO attainment |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups = [("overall", report["overall"])] + list(report["tenants"].items())
    for name, g in groups:
        errors = ", ".join(f"{k}: {v}" for k, v in g["errors_by_status"].items()) or "-"
        lines.append(
            f"| {name} | {g['requests']} | {g['ok']} | {g['cancelled']} | {errors} | {_fmt(g['requests_per_s'])} "
            f"| {_fmt(g['output_tokens_per_s'])} | {_fmt(g['goodput'])} | {_fmt(g['slo_attainment'])} |"
        )
    lines += [
        "",
        "## Latency (ms)",
        "",
        "| group | metric | p50 | p90 | p99 | mean |",
        "|---|---|---|---|---|---|",
    ]
    for name, g in groups:
        lines += _group_rows(name, g)
    lines += ["", "## Lengths (tokens)", "", "| what | count | min | p50 | p90 | p99 | max | mean |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for key in ("prompt_tokens", "output_tokens", "max_tokens"):
        d = meta[key]
        cells = " | ".join(_fmt(d[k]) for k in ("count", "min", "p50", "p90", "p99", "max", "mean"))
        lines.append(f"| {key} | {cells} |")
    if plot_files:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plot_files]
    return "\n".join(lines) + "\n"
