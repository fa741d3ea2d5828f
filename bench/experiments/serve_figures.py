"""What one guidellm run of `weir_bench.experiments.serve_vs_peer` measured, and its tables.

- `ServeFigures` / `parse_guidellm`: one system's figures from guidellm's benchmarks.json;
- `gc_pause_totals`, `step_split`, `wide_step_choices`, `admitted_by_class`: what Weir's `/metrics`
  page says after the run (garbage collections; decode-only steps against steps feeding prompt
  tokens; the threads each bucket of wide steps chose; the requests admitted per tenant class);
- `ratios`, `TARGETS`: Weir over a peer, and the issues' targets;
- `markdown` (one round), `over_rounds` / `rounds_markdown` (every round, each ratio's median).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weir_bench.experiments.alternation import RoundRatios, summarise
from weir_bench.experiments.prefill_overlap import prefills_in_decode, request_times


@dataclass(frozen=True)
class ServeFigures:
    """What guidellm measured for one system."""

    system: str
    output_tok_s: float
    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    num_ok: int
    num_errored: int
    wall_s: float
    server_gauges: dict[str, float] = field(default_factory=dict)  # Weir's step budget after the run
    # other requests' first tokens inside a request's decode, mean (bench/experiments/prefill_overlap.py)
    prefills_in_decode: float | None = None
    # the priority class of the tenant whose key the load used (Weir only; a peer has no tenants)
    tenant_class: str | None = None
    # share of all requests within the interactive targets (`goodput`); None without per-request data
    goodput: float | None = None
    # the opening burst (`opening_burst`, `with_opening_cpu`): first tokens in time, CPU used by side
    opening: dict[str, float] = field(default_factory=dict)


def _stat(metrics: Mapping[str, Any], name: str, key: str) -> float:
    summary = metrics[name]["successful"]
    if key.startswith("p"):
        return float(summary["percentiles"][key])
    return float(summary[key])


# The interactive class's targets (engine/latency_targets.py, CPU): issue 58's goodput.
GOODPUT_TTFT_MS = 2000.0
GOODPUT_ITL_MS = 100.0


def goodput(
    report: Mapping[str, Any], ttft_ms: float = GOODPUT_TTFT_MS, itl_ms: float = GOODPUT_ITL_MS
) -> float | None:
    """The share of all requests (failed and unfinished ones count as misses) whose TTFT and mean
    inter-token time are within the targets; None when the report has no requests. guidellm keeps
    each request's mean inter-token time, not every gap, so "every ITL" is read as its mean."""
    requests = report["benchmarks"][0].get("requests", {})
    total = sum(len(requests.get(kind) or []) for kind in ("successful", "errored", "incomplete"))
    if not total:
        return None
    met = sum(
        1
        for r in requests.get("successful") or []
        if r.get("time_to_first_token_ms") is not None
        and float(r["time_to_first_token_ms"]) <= ttft_ms
        and float(r.get("inter_token_latency_ms") or 0.0) <= itl_ms
    )
    return met / total


def parse_guidellm(system: str, report: Mapping[str, Any], wall_s: float) -> ServeFigures:
    """The figures of guidellm 0.8.1's benchmarks.json (one benchmark)."""
    bench = report["benchmarks"][0]
    m = bench["metrics"]
    totals = m["request_totals"]
    return ServeFigures(
        system=system,
        output_tok_s=_stat(m, "output_tokens_per_second", "mean"),
        itl_p50_ms=_stat(m, "inter_token_latency_ms", "median"),
        itl_p99_ms=_stat(m, "inter_token_latency_ms", "p99"),
        ttft_p50_ms=_stat(m, "time_to_first_token_ms", "median"),
        ttft_p99_ms=_stat(m, "time_to_first_token_ms", "p99"),
        num_ok=int(totals["successful"]),
        num_errored=int(totals["errored"]),
        wall_s=round(wall_s, 1),
        prefills_in_decode=prefills_in_decode(request_times(report)),
        goodput=goodput(report),
        opening=opening_burst(report),
    )


def sent_requests(report: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """(wall time sent, TTFT in ms or None) of every request guidellm sent, failed ones too."""
    bench = report["benchmarks"][0]
    return [
        (r["info"]["timings"]["request_start"], r.get("time_to_first_token_ms"))
        for kind in ("successful", "errored", "incomplete")
        for r in (bench.get("requests", {}).get(kind) or [])
        if r.get("info", {}).get("timings", {}).get("request_start") is not None
    ]


def opening_window(report: Mapping[str, Any], seconds: float = 3.0) -> tuple[float, float] | None:
    """Wall times from guidellm's first request sent to `seconds` later."""
    sent = sent_requests(report)
    if not sent:
        return None
    first = min(t for t, _ in sent)
    return first, first + seconds


def opening_burst(report: Mapping[str, Any], ttft_ms: float = GOODPUT_TTFT_MS) -> dict[str, float]:
    """The requests guidellm sent together at the start (those sent within 0.5 s of the first):
    how many, and how many got their first token within `ttft_ms`."""
    sent = sent_requests(report)
    if not sent:
        return {}
    first = min(t for t, _ in sent)
    burst = [ttft for t, ttft in sent if t - first <= 0.5]
    within = sum(1 for ttft in burst if ttft is not None and float(ttft) <= ttft_ms)
    return {"burst_size": float(len(burst)), "burst_within": float(within)}


def gc_pause_totals(page: str) -> dict[str, float]:
    """`gc<generation>_count` and `gc<generation>_s` from `weir_gc_pause_seconds` on a metrics page:
    the garbage collections the server stood still for during its life, and their seconds."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            generation = sample.labels.get("generation")
            if generation is None or not sample.name.startswith("weir_gc_pause_seconds_"):
                continue
            if sample.name.endswith("_count"):
                totals[f"gc{generation}_count"] = sample.value
            elif sample.name.endswith("_sum"):
                totals[f"gc{generation}_s"] = sample.value
    return totals


def step_split(page: str) -> dict[str, float]:
    """`<kind>_steps` and `<kind>_step_ms` (mean) for `kind` prefill and decode from
    `weir_engine_steps_total` / `weir_engine_step_seconds_total` on a metrics page: how long the
    server's decode-only steps took, and the steps that also fed prompt tokens."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            kind = sample.labels.get("kind")
            if kind is None:
                continue
            if sample.name == "weir_engine_steps_total":
                counts[kind] = counts.get(kind, 0.0) + sample.value
            elif sample.name == "weir_engine_step_seconds_total":
                seconds[kind] = seconds.get(kind, 0.0) + sample.value
    out: dict[str, float] = {}
    for kind, n in counts.items():
        out[f"{kind}_steps"] = n
        if n:
            out[f"{kind}_step_ms"] = round(seconds.get(kind, 0.0) / n * 1e3, 2)
    return out


def wide_step_choices(page: str) -> dict[str, float]:
    """`threads_<min_rows>`: the intra-op threads each bucket of wide steps ran on at the end
    (`weir_engine_wide_step_threads_chosen` on a metrics page; engine/runner/step_threads.py)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "weir_engine_wide_step_threads_chosen" and "min_rows" in sample.labels:
                out[f"threads_{sample.labels['min_rows']}"] = sample.value
    return out


def admitted_by_class(page: str) -> dict[str, float]:
    """`admitted_<class>`: the requests admission let through per tenant priority class, all tenants
    summed (`weir_admission_admitted` on a metrics page): the class the load really ran under."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "weir_admission_admitted_total" and "priority" in sample.labels:
                key = f"admitted_{sample.labels['priority']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


# issue 27 against llama-server (fp32), issue 13 against transformers serve: (target, higher is better)
TARGETS = {
    "llama": {"output_tok_s": (1.0, True), "itl_p50": (1.0, False)},
    "tserve": {"output_tok_s": (2.0, True), "itl_p50": (0.5, False), "ttft_p50": (1.0, False)},
}


def ratios(weir: ServeFigures, peer: ServeFigures) -> dict[str, float]:
    """Weir over the peer: throughput (higher is better), ITL and TTFT p50 (lower is better)."""
    return {
        "output_tok_s": round(weir.output_tok_s / peer.output_tok_s, 2),
        "itl_p50": round(weir.itl_p50_ms / peer.itl_p50_ms, 2),
        "ttft_p50": round(weir.ttft_p50_ms / peer.ttft_p50_ms, 2),
    }


def markdown(rows: Sequence[ServeFigures], weir_names: Sequence[str], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "| server | tenant class | output tok/s | ITL p50 ms | ITL p99 ms | TTFT p50 ms | TTFT p99 ms "
        "| ok / errors | wall s | prefills in a decode | goodput 2 s / 100 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        overlap = "-" if r.prefills_in_decode is None else f"{r.prefills_in_decode:.1f}"
        good = "-" if r.goodput is None else f"{r.goodput:.0%}"
        lines.append(
            f"| {r.system} | {r.tenant_class or '-'} | {r.output_tok_s:.1f} | {r.itl_p50_ms:.0f} | {r.itl_p99_ms:.0f} | {r.ttft_p50_ms:,.0f} "
            f"| {r.ttft_p99_ms:,.0f} | {r.num_ok} / {r.num_errored} | {r.wall_s} | {overlap} | {good} |"
        )
    lines.append(
        "\nTenant class: the priority of the tenant whose key Weir's load used (`--tenant-class`); "
        "a peer has no tenants (-)."
    )
    lines.append(
        "\nGoodput: the share of requests within the interactive targets, TTFT 2 s and a mean "
        "inter-token time of 100 ms (guidellm keeps each request's mean gap, not every gap)."
    )
    lines.append(
        "\nPrefills in a decode: other requests' first tokens inside a request's decode window, mean "
        "(bench/experiments/prefill_overlap.py); their prefill steps are in its ITL."
    )
    for r in rows:
        if r.server_gauges:
            g = r.server_gauges
            lines.append(
                f"\n{r.system} after the run: token budget {g.get('weir_scheduler_token_budget', 0):.0f}, "
                f"target {g.get('weir_scheduler_target_step_seconds', 0) * 1e3:.0f} ms, fitted "
                f"{g.get('weir_scheduler_step_overhead_seconds', 0) * 1e3:.1f} ms + "
                f"{g.get('weir_scheduler_step_cost_per_decode_seconds', 0) * 1e3:.2f} ms/decode + "
                f"{g.get('weir_scheduler_step_cost_per_token_seconds', 0) * 1e3:.2f} ms/prefill token, "
                f"margin {g.get('weir_scheduler_step_margin', 0):.0%}, running cap "
                + (f"{g['weir_scheduler_max_running']:.0f}" if "weir_scheduler_max_running" in g else "none")
                + f", fits dropped {g.get('weir_scheduler_step_fit_resets_total', 0):.0f}"
            )
            if any(key.startswith("gc") for key in g):
                lines.append(
                    f"{r.system} garbage collections over its life: "
                    + ", ".join(
                        f"generation {gen} {g.get(f'gc{gen}_count', 0):.0f} ({g.get(f'gc{gen}_s', 0) * 1e3:.0f} ms)"
                        for gen in range(3)
                    )
                )
    for r in rows:
        o = r.opening
        if o:
            cpu = (
                f"; in its first {o['window_s']:.0f} s guidellm used {o['client_cpu_s']:.1f} CPU-s and the "
                f"server {o['server_cpu_s']:.1f}"
                if "client_cpu_s" in o and "server_cpu_s" in o
                else ""
            )
            lines.append(
                f"\n{r.system} opening burst: {o['burst_within']:.0f} of {o['burst_size']:.0f} first tokens "
                f"within {GOODPUT_TTFT_MS / 1000:.0f} s{cpu} (bench/experiments/process_cpu.py)"
            )
    peers = [r for r in rows if r.system not in weir_names]
    weirs = [r for r in rows if r.system in weir_names]
    if peers and weirs:
        lines += [
            "",
            "| Weir variant / peer | tok/s ratio | ITL p50 ratio | TTFT p50 ratio |",
            "|---|---|---|---|",
        ]
        for w in weirs:
            for p in peers:
                q = ratios(w, p)
                lines.append(
                    f"| {w.system} / {p.system} | {q['output_tok_s']} | {q['itl_p50']} | {q['ttft_p50']} |"
                )
        lines += [
            "",
            "Targets: vs tserve tok/s >= 2, ITL p50 <= 0.5, TTFT p50 <= 1 (issue 13); vs llama (fp32) "
            "tok/s >= 1.0, ITL p50 <= 1.0 (issue 27).",
        ]
    for fig in rows:
        g = fig.server_gauges
        if "decode_step_ms" in g or "prefill_step_ms" in g:
            lines.append(
                f"\n{fig.system} steps: {g.get('decode_steps', 0):.0f} decode-only, mean "
                f"{g.get('decode_step_ms', 0):.1f} ms; {g.get('prefill_steps', 0):.0f} feeding prompt tokens, "
                f"mean {g.get('prefill_step_ms', 0):.1f} ms"
            )
        admitted = {k.removeprefix("admitted_"): v for k, v in g.items() if k.startswith("admitted_")}
        if admitted:
            lines.append(
                f"{fig.system} requests admitted by tenant class: "
                + ", ".join(f"{cls} {count:.0f}" for cls, count in sorted(admitted.items()))
            )
        choices = sorted(
            (int(k.removeprefix("threads_")), v) for k, v in g.items() if k.startswith("threads_")
        )
        if choices:
            lines.append(
                f"{fig.system} wide steps' threads at the end: "
                + ", ".join(f"{rows}+ rows {count:.0f}" for rows, count in choices)
            )
    return "\n".join(lines) + "\n"


def over_rounds(rounds: Sequence[Sequence[ServeFigures]], weir_names: Sequence[str]) -> list[RoundRatios]:
    """Every Weir variant's ratios to every peer with a target, one value a round; a pair missing
    from any round (a peer that did not start) is left out."""
    by_round = [{r.system: r for r in rows} for rows in rounds]
    in_every = set.intersection(*(set(names) for names in by_round))
    systems = [r.system for r in rounds[0] if r.system in in_every]
    out: list[RoundRatios] = []
    for w in (s for s in systems if s in weir_names):
        for p in (s for s in systems if s not in weir_names and s in TARGETS):
            per_round = [ratios(by_name[w], by_name[p]) for by_name in by_round]
            out += summarise(per_round, TARGETS[p], prefix=f"{w} / {p} ")
    return out


def rounds_markdown(
    rounds: Sequence[Sequence[ServeFigures]],
    weir_names: Sequence[str],
    command: str,
    orders: Sequence[Sequence[str]],
) -> str:
    """One table per round (headed by the order its systems ran in), then each targeted ratio over
    the rounds (median, spread, rounds met)."""
    if len(rounds) == 1:
        return markdown(rounds[0], weir_names, command)
    parts = [f"`{command}`", ""]
    for i, (rows, ran) in enumerate(zip(rounds, orders, strict=True), 1):
        order = ", ".join(ran)
        parts += [f"## Round {i} ({order})", "", markdown(rows, weir_names, command).split("\n", 2)[2]]
    parts += [f"## Over {len(rounds)} rounds (ratios within a round)", ""]
    parts += [f"- {r.line()}" for r in over_rounds(rounds, weir_names)]
    return "\n".join(parts) + "\n"
