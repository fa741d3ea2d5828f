"""weir_bench.offline: report arithmetic (ratios, roofline) and the Markdown table, without running models."""

from __future__ import annotations

from weir.engine.config import ModelConfig, RopeConfig
from weir_bench.flops import WorkItem, request_flops
from weir_bench.offline import OfflineRequest, RunResult, build_report, to_markdown

MODEL = ModelConfig(
    model_type="llama",
    vocab_size=100,
    hidden_size=8,
    intermediate_size=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    rms_norm_eps=1e-6,
    rope=RopeConfig(),
    max_model_len=64,
)


def test_request_flops_counts_fed_tokens_head_and_attention() -> None:
    one = request_flops(MODEL, WorkItem(1, 1))  # one token fed, one sampled, attends to itself
    proj = 2 * 2 * (8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16)
    assert one == proj + 2 * 100 * 8 + 4 * 2 * 2 * 4 * 1
    assert request_flops(MODEL, WorkItem(3, 2)) > request_flops(MODEL, WorkItem(3, 1))


def test_report_ratios_roofline_and_markdown() -> None:
    reqs = [OfflineRequest("a", (1, 2, 3), 4), OfflineRequest("b", (1,) * 10, 2)]
    results = [
        RunResult("weir-continuous", 1.0, 13, 6, [0.1, 0.2], [0.01]),
        RunResult("hf-static", 2.0, 13, 6, [], []),
    ]
    report = build_report(results, reqs, MODEL, peak=1e9, meta={})
    weir = report["systems"]["weir-continuous"]
    assert weir["total_tok_s_vs_hf-static"] == 2.0
    assert weir["x_roofline"] == 1.0 / report["roofline_wall_s"]
    assert weir["ttft_ms"]["p50"] == 150.0 and report["systems"]["hf-static"]["ttft_ms"]["p50"] is None
    table = to_markdown(report)
    assert "| weir-continuous | 1.0 |" in table and "2.00×" in table
