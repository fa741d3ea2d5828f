"""The prefix-cache benchmark runner on a tiny model: report shape and token accounting (no timing)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir_bench.experiments.prefix_cache import add_arguments, mann_whitney_p, run, to_markdown


def test_mann_whitney() -> None:
    same = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert mann_whitney_p(same, list(reversed(same))) > 0.9
    assert mann_whitney_p([1.0, 1.1, 1.2, 1.3, 1.4, 1.5], [9.0, 9.1, 9.2, 9.3, 9.4, 9.5]) < 0.01
    assert mann_whitney_p([2.0, 2.0], [2.0, 2.0]) == 1.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("bench-prefix"), arch="llama", max_position_embeddings=1024
    )


def test_run_reports_both_replays_and_the_probe(tiny: Path, tmp_path: Path) -> None:
    systems = {
        "acme": "The scheduler runs decode tokens first. " * 8,
        "globex": "Paged attention stores keys. " * 9,
    }
    rows = []
    for i in range(8):
        tenant = "acme" if i % 2 == 0 else "globex"
        messages = [
            {"role": "system", "content": systems[tenant]},
            {"role": "user", "content": f"question {i}?"},
        ]
        rows.append(
            {
                "id": f"r{i}",
                "t": 0.01 * i,
                "tenant": tenant,
                "kind": "chat",
                "messages": messages,
                "max_tokens": 3,
            }
        )
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--model", str(tiny), "--workload", str(trace), "--probe-trials", "2", "--kv-cache-tokens", "4096"]
    )
    report = run(args)
    off, on = report["runs"]["off"], report["runs"]["on"]
    assert off["prompt_tokens"] == on["prompt_tokens"] == off["prefill_tokens_computed"]
    assert off["cached_tokens"] == 0 and on["cached_tokens"] > 0
    assert on["prefill_tokens_computed"] + on["cached_tokens"] == on["prompt_tokens"]
    assert 0 < report["prefill_tokens_drop"] < 1
    assert on["num_requests"] == off["num_requests"] == 8 and on["output_tokens"] == 24
    probe = report["timing_probe"]
    assert (
        probe["trials"] == 2 and probe["cross_tenant_cached_tokens"] == 0 and probe["cold_cached_tokens"] == 0
    )
    assert probe["own_tenant_hit_ttft_ms"]["p50"] is not None
    assert "TTFT p50 on/off" in to_markdown(report)
