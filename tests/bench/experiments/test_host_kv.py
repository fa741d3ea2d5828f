"""The host KV tier benchmark on a tiny model: every engine completes the burst, the report's
shape and counts, and the chat part saves prefill with the same tokens (no timing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir_bench.experiments.host_kv import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("bench-host-kv"), arch="llama", max_position_embeddings=1024
    )


def _workload(path: Path) -> Path:
    rows = [
        {
            "id": f"m{i}",
            "t": i * 0.01,
            "tenant": ("acme", "globex")[i % 2],
            "kind": "chat",
            "messages": [
                {"role": "user", "content": "The scheduler runs decode tokens first. " * (2 + i % 4)}
            ],
            "max_tokens": 8 + i,
        }
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_burst_and_the_chat_on_a_tiny_model(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = ["--model", str(tiny), "--workload", str(_workload(tmp_path / "w.jsonl")), "--out", str(out)]
    argv += ["--requests", "12", "--device-tokens", "256", "--host-tokens", "2048"]
    argv += ["--conversations", "4", "--turns", "3", "--chat-device-tokens", "256", "--chat-max-tokens", "8"]
    argv += ["--chat-user-tokens", "24"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    runs = {r["engine"]: r for r in report["burst"]["runs"]}
    assert set(report["burst"]["median_output_tokens_per_s"]) == set(runs)
    assert set(runs) == {"swap", "recompute", "unconstrained"}
    for run in runs.values():
        assert run["completed"] == run["requests"] == 12
        assert run["ttft_ms"]["p50"] is not None and run["output_tokens"] == sum(8 + i for i in range(12))
    assert runs["unconstrained"]["preemptions"] == {"swap": 0, "recompute": 0}
    assert runs["recompute"]["preemptions"]["swap"] == 0 and runs["recompute"]["preemptions"]["recompute"] > 0
    assert sum(runs["swap"]["preemptions"].values()) > 0 and runs["swap"]["copy_gb_per_s"] > 0
    chat = report["chat"]
    assert chat["same_tokens"]
    assert chat["with_host_tier"]["prefix_promotions"] > 0
    saved = chat["prefill_tokens_saved"]
    assert saved == (
        chat["without_host_tier"]["prefill_tokens_computed"]
        - chat["with_host_tier"]["prefill_tokens_computed"]
    )
    assert saved > 0
