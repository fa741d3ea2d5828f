"""The KV store experiment's bookkeeping: which requests are cross-replica, and the summary's
targets (the replicas themselves are exercised by tests/e2e/test_kv_store_replicas.py)."""

from __future__ import annotations

from weir_bench.experiments.kv_store import Answer, ArmResult, cross_replica_ids, markdown, summarize
from weir_bench.workloads import ChatMessage, RequestKind, WorkloadRequest


def _req(i: int, tenant: str, system: str) -> WorkloadRequest:
    messages = (ChatMessage("system", system), ChatMessage("user", f"q{i}"))
    return WorkloadRequest(f"r{i}", float(i), tenant, RequestKind.CHAT, 8, messages=messages)


def test_a_request_is_cross_replica_when_its_prefix_ran_only_on_other_replicas() -> None:
    reqs = [_req(0, "a", "S"), _req(1, "a", "S"), _req(2, "b", "S"), _req(3, "a", "S"), _req(4, "a", "T")]
    # replicas 0, 1, 0, 1, 0 (round robin over two): r1 is the first on replica 1 of (a, S);
    # r2 is another tenant's prefix (first seen); r3 ran on replica 1 before (r1); r4 is new.
    assert cross_replica_ids(reqs, 2) == {"r1"}
    assert cross_replica_ids(reqs, 1) == set()


def test_the_summary_reports_the_three_targets() -> None:
    def arm(name: str, ttft: float, cached: int, failed: bool = False) -> ArmResult:
        return ArmResult(
            name,
            [
                Answer("r0", 0, True, 1.0, 100, 0),
                Answer("r1", 1, not failed, ttft, 100, cached, "" if not failed else "HTTP 500"),
            ],
        )

    results = {
        "one": arm("one", 0.1, 90),
        "replicas": arm("replicas", 1.0, 0),
        "replicas+store": arm("replicas+store", 0.3, 81),
    }
    summary = summarize(results, {"r1"})
    assert summary["cached_share_vs_one"] == 0.9
    assert summary["cross_replica_ttft_p50_ratio"] == 0.3
    assert summary["failed_with_store"] == 0
    assert summary["arms"]["replicas"]["cached_share_of_prompt_tokens"] == 0.0
    assert "| replicas+store | 2 | 0 | 0.405 |" in markdown(summary)
    broken = summarize({**results, "replicas+store": arm("replicas+store", 0.3, 81, failed=True)}, {"r1"})
    assert broken["failed_with_store"] == 1 and broken["arms"]["replicas+store"]["errors"] == ["HTTP 500"]
