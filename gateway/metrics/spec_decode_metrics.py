"""`/metrics` of speculative decoding (engine/spec_decode), read from the engine snapshot at scrape time.

- `weir_spec_decode_draft_tokens`: draft tokens verified by the target (counter);
- `weir_spec_decode_accepted_tokens`: of them, accepted (counter);
- `weir_spec_decode_emitted_tokens`: tokens emitted by verify steps, accepted drafts plus the one
  token each step samples after them, cut at stops (counter);
- `weir_spec_decode_acceptance_rate`: accepted over drafted since start (gauge, 0 before any).

All are 0 on a server that does not speculate.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from weir.engine.engine_stats import EngineStats


def spec_decode_metrics(s: EngineStats) -> Iterator[Metric]:
    """The speculative-decoding families of one engine snapshot."""
    drafted, accepted = s.num_spec_draft_tokens_total, s.num_spec_accepted_tokens_total
    yield CounterMetricFamily(
        "weir_spec_decode_draft_tokens", "Draft tokens verified by the target model.", value=drafted
    )
    yield CounterMetricFamily(
        "weir_spec_decode_accepted_tokens", "Draft tokens the target model accepted.", value=accepted
    )
    yield CounterMetricFamily(
        "weir_spec_decode_emitted_tokens",
        "Tokens emitted by speculative verify steps (accepted drafts plus one sampled token each).",
        value=s.num_spec_emitted_tokens_total,
    )
    yield GaugeMetricFamily(
        "weir_spec_decode_acceptance_rate",
        "Accepted over verified draft tokens since start (0-1; 0 before any).",
        value=accepted / drafted if drafted else 0.0,
    )
