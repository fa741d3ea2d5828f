"""The server's own Prometheus `/metrics`, to check a report against what the server counted.

Counters are cumulative, so the check uses the difference of two scrapes taken around a run
(`after.minus(before)`). Token counts must agree exactly; mean TTFT within a tolerance, as the
client's TTFT also holds HTTP, queueing in the socket and parsing that the server never sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    """One sample line: name, sorted labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class ServerMetrics:
    """A parsed scrape of /metrics."""

    samples: tuple[Sample, ...]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the samples called `name` whose labels include `labels`; None if there are none."""
        want = set(labels.items())
        values = [s.value for s in self.samples if s.name == name and want <= set(s.labels)]
        return sum(values) if values else None

    def minus(self, before: ServerMetrics) -> ServerMetrics:
        """Sample-wise difference with an earlier scrape (a sample absent before counts from 0)."""
        old = {(s.name, s.labels): s.value for s in before.samples}
        return ServerMetrics(
            tuple(Sample(s.name, s.labels, s.value - old.get((s.name, s.labels), 0.0)) for s in self.samples)
        )


def parse_server_metrics(text: str) -> ServerMetrics:
    """Parse Prometheus text exposition; raises ValueError on text that is not."""
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return ServerMetrics(tuple(samples))


async def fetch_server_metrics(
    client: httpx.AsyncClient, server_root: str, admin_token: str | None = None
) -> ServerMetrics:
    """GET {server_root}/metrics and parse it.

    `server_root` is Weir's metrics listener (`--metrics-port`, no token), or its API port with
    `admin_token`: there /metrics answers only the admin token, since it names every tenant.
    """
    headers = {"authorization": f"Bearer {admin_token}"} if admin_token else None
    resp = await client.get(f"{server_root}/metrics", headers=headers)
    resp.raise_for_status()
    return parse_server_metrics(resp.text)


@dataclass(frozen=True)
class MetricNames:
    """Sample names of the server's metrics (Weir's by default; a peer's can be given)."""

    prompt_tokens: str = "weir_prompt_tokens_total"
    output_tokens: str = "weir_generation_tokens_total"
    ttft_sum: str = "weir_time_to_first_token_seconds_sum"
    ttft_count: str = "weir_time_to_first_token_seconds_count"


@dataclass(frozen=True)
class Agreement:
    """Client figures next to the server's, and what disagrees."""

    client_prompt_tokens: int
    server_prompt_tokens: float | None
    client_output_tokens: int
    server_output_tokens: float | None
    client_ttft_mean_ms: float | None
    server_ttft_mean_ms: float | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every figure agrees."""
        return not self.problems


def check_agreement(
    group: Mapping[str, Any],
    server: ServerMetrics,
    names: MetricNames | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    ttft_abs_ms: float = 50.0,
    ttft_rel: float = 0.2,
) -> Agreement:
    """Compare one report group (overall, or a tenant's with `labels={"tenant": ...}`) with a
    server scrape delta covering the same run.

    Tokens must match exactly: run without cancellations, as a cancelled request's server-side
    count includes tokens the client never received. TTFT means agree when they differ by at
    most max(ttft_abs_ms, ttft_rel * client mean).
    """
    names = names or MetricNames()
    lab = dict(labels or {})
    problems = []
    s_prompt = server.total(names.prompt_tokens, **lab)
    s_output = server.total(names.output_tokens, **lab)
    for what, client_value, server_value in (
        ("prompt tokens", group["prompt_tokens"], s_prompt),
        ("output tokens", group["output_tokens"], s_output),
    ):
        if server_value is None:
            problems.append(f"server exposes no {what} metric")
        elif round(server_value) != client_value:
            problems.append(f"{what}: client {client_value}, server {server_value:g}")
    ttft_sum = server.total(names.ttft_sum, **lab)
    ttft_count = server.total(names.ttft_count, **lab)
    s_ttft = ttft_sum * 1000.0 / ttft_count if ttft_sum is not None and ttft_count else None
    c_ttft = group["ttft_ms"]["mean"]
    if s_ttft is None:
        problems.append("server exposes no TTFT histogram (or it counted nothing)")
    elif c_ttft is None:
        problems.append("the report has no TTFT")
    elif abs(c_ttft - s_ttft) > max(ttft_abs_ms, ttft_rel * c_ttft):
        problems.append(f"mean TTFT: client {c_ttft:.1f} ms, server {s_ttft:.1f} ms")
    return Agreement(
        client_prompt_tokens=group["prompt_tokens"],
        server_prompt_tokens=s_prompt,
        client_output_tokens=group["output_tokens"],
        server_output_tokens=s_output,
        client_ttft_mean_ms=c_ttft,
        server_ttft_mean_ms=s_ttft,
        problems=tuple(problems),
    )
