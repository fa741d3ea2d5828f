"""`weir bench compare A.json B.json`: B/A ratios per metric, for before/after or Weir/peer."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir_bench.report import LATENCY_KEYS, LATENCY_METRICS

# Scalar metrics of a group that are compared, with whether more is better.
_SCALARS = {
    "requests_per_s": True,
    "output_tokens_per_s": True,
    "goodput": True,
    "slo_attainment": True,
    "ok": True,
    "requests": True,
    "prompt_tokens": True,
    "output_tokens": True,
}


class Verdict(enum.Enum):
    """Whether B is better than A on one metric."""

    BETTER = "better"
    WORSE = "worse"
    SAME = "same"
    NA = "n/a"


@dataclass(frozen=True)
class MetricComparison:
    """One metric of one group in both reports."""

    group: str  # "overall" or "tenant:<name>"
    metric: str  # e.g. "ttft_ms.p99"
    a: float | None
    b: float | None
    ratio: float | None  # b / a; None when either is missing or a is 0
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        """One entry of the comparison JSON."""
        return {"a": self.a, "b": self.b, "ratio": self.ratio, "verdict": self.verdict.value}


def _metrics(group: Mapping[str, Any]) -> dict[str, tuple[float | None, bool]]:
    """Flattened metrics of a group: name -> (value, higher is better)."""
    out: dict[str, tuple[float | None, bool]] = {}
    for metric in LATENCY_METRICS:
        lat = group.get(metric) or {}
        for key in LATENCY_KEYS:
            out[f"{metric}.{key}"] = (lat.get(key), False)
    for name, higher in _SCALARS.items():
        out[name] = (group.get(name), higher)
    return out


def _verdict(a: float | None, b: float | None, higher_is_better: bool, same_within: float) -> Verdict:
    if a is None or b is None:
        return Verdict.NA
    if abs(b - a) <= same_within * max(abs(a), abs(b)):
        return Verdict.SAME
    return Verdict.BETTER if (b > a) == higher_is_better else Verdict.WORSE


def compare_groups(
    name: str, a: Mapping[str, Any], b: Mapping[str, Any], same_within: float = 0.02
) -> list[MetricComparison]:
    """Every metric of two groups; changes within `same_within` (relative) count as the same."""
    ma, mb = _metrics(a), _metrics(b)
    out = []
    for metric, (va, higher) in ma.items():
        vb = mb[metric][0]
        ratio = vb / va if va not in (None, 0) and vb is not None else None
        out.append(MetricComparison(name, metric, va, vb, ratio, _verdict(va, vb, higher, same_within)))
    return out


def compare_reports(
    a: Mapping[str, Any], b: Mapping[str, Any], same_within: float = 0.02
) -> list[MetricComparison]:
    """The overall group and every tenant present in both reports."""
    out = compare_groups("overall", a["overall"], b["overall"], same_within)
    for tenant in sorted(set(a.get("tenants", {})) & set(b.get("tenants", {}))):
        out += compare_groups(f"tenant:{tenant}", a["tenants"][tenant], b["tenants"][tenant], same_within)
    return out


def comparison_json(rows: list[MetricComparison], path_a: str, path_b: str) -> dict[str, Any]:
    """`{"a", "b", "groups": {group: {metric: {"a", "b", "ratio", "verdict"}}}}`."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        groups.setdefault(row.group, {})[row.metric] = row.to_json()
    return {"a": path_a, "b": path_b, "groups": groups}


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def format_table(rows: list[MetricComparison]) -> str:
    """A plain-text table: group, metric, A, B, B/A, verdict."""
    header = ("group", "metric", "A", "B", "B/A", "")
    body = [(r.group, r.metric, _num(r.a), _num(r.b), _num(r.ratio), r.verdict.value) for r in rows]
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *body]
    ]
    return "\n".join(lines)


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a report.json (or a run directory holding one); raises ValueError if it is not one."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    with open(p, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or "overall" not in data:
        raise ValueError(f"{p} is not a bench serve report (no 'overall')")
    return data
