"""weir_bench.loadgen against the scripted fake server: timings, replay, cancellation, failures."""

from __future__ import annotations

import asyncio
import json
import socket

from weir_bench.arrivals import ArrivalMode, ArrivalSpec
from weir_bench.loadgen import (
    BodyOptions,
    LoadOptions,
    LoadResult,
    plan_requests,
    request_body,
    run_load,
    server_root,
)
from weir_bench.records import Outcome
from weir_bench.report import SLO, GroupReport
from weir_bench.stats import LatencySummary
from weir_bench.workloads import ChatMessage, RequestKind, WorkloadRequest

QUIET = LoadOptions(timeout_s=10.0, max_duration_s=60.0, progress=False)


def chat(
    i: int,
    max_tokens: int = 8,
    t: float = 0.0,
    cancel_after_tokens: int | None = None,
    after: str | None = None,
) -> WorkloadRequest:
    return WorkloadRequest(
        id=f"req-{i}",
        t=t,
        tenant="acme",
        kind=RequestKind.CHAT,
        max_tokens=max_tokens,
        priority="interactive",
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", f"question number {i}")),
        ignore_eos=True,
        cancel_after_tokens=cancel_after_tokens,
        after=after,
    )


def run(
    requests: list[WorkloadRequest], url: str, arrival: ArrivalSpec, options: LoadOptions = QUIET
) -> LoadResult:
    plans = plan_requests(requests, base_url=url, model="fake-model", arrival=arrival)
    return asyncio.run(run_load(plans, arrival, options))


def closed(c: int) -> ArrivalSpec:
    return ArrivalSpec(mode=ArrivalMode.CONCURRENCY, concurrency=c)


def test_request_body_and_urls() -> None:
    req = chat(0, max_tokens=5)
    body = request_body(req, "m", BodyOptions())
    assert body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "question number 0"},
        ],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": "interactive",
        "ignore_eos": True,
    }
    peer = request_body(req, "m", BodyOptions(send_priority=False, send_ignore_eos=False))
    assert "priority" not in peer and "ignore_eos" not in peer
    comp = WorkloadRequest(id="c", t=0, tenant="a", kind=RequestKind.COMPLETION, max_tokens=3, prompt="hi")
    assert request_body(comp, "m", BodyOptions())["prompt"] == "hi"
    assert server_root("http://h:1/v1/") == server_root("http://h:1") == "http://h:1"
    plans = plan_requests([req, comp], base_url="http://h:1/v1", model="m", arrival=ArrivalSpec())
    assert [p.url for p in plans] == ["http://h:1/v1/chat/completions", "http://h:1/v1/completions"]


def _timing_mismatches(fake_server, ttft_ms: int, itl_ms: int, n: int) -> list[str]:
    result = run([chat(i, max_tokens=n) for i in range(8)], fake_server.url("ok", ttft_ms, itl_ms), closed(2))
    records = result.records
    assert [r.outcome for r in records] == [Outcome.OK] * 8
    assert all(r.completion_tokens == n and r.num_content_chunks == n for r in records)
    group = GroupReport.of(records, result.duration_s, SLO())
    # The script was followed: no first token before its time, no answer before its last token.
    assert group.ttft_ms.p50 >= ttft_ms and group.e2e_ms.p50 >= ttft_ms + (n - 1) * itl_ms

    log = {e["request_id"]: e for e in fake_server.log()}
    ttft, itl, tpot, e2e = [], [], [], []
    for r in records:
        entry = log[r.request_id]
        send = result.clock_origin + r.start_s
        content = [(t - send) * 1000.0 for t in entry["sent_at"][1 : 1 + n]]  # after the role chunk
        done = (entry["sent_at"][-1] - send) * 1000.0
        ttft.append(content[0])
        itl += [b - a for a, b in zip(content, content[1:], strict=False)]
        tpot.append((done - content[0]) / (n - 1))
        e2e.append(done)
    checks = [
        ("itl vs script", group.itl_ms, LatencySummary(itl_ms, itl_ms, itl_ms, itl_ms, 0), ("p50", "mean")),
        ("tpot vs script", group.tpot_ms, LatencySummary(itl_ms, itl_ms, itl_ms, itl_ms, 0), ("p50", "mean")),
    ]
    for name, measured, sent in (("ttft", group.ttft_ms, ttft), ("itl", group.itl_ms, itl)):
        checks.append((f"{name} vs sent", measured, LatencySummary.of(sent), ("p50", "p90", "p99", "mean")))
    for name, measured, sent in (("tpot", group.tpot_ms, tpot), ("e2e", group.e2e_ms, e2e)):
        checks.append((f"{name} vs sent", measured, LatencySummary.of(sent), ("p50", "p90", "p99", "mean")))
    return [
        f"{name} {key}: measured {getattr(measured, key):.2f}, expected {getattr(expected, key):.2f}"
        for name, measured, expected, keys in checks
        for key in keys
        if abs(getattr(measured, key) - getattr(expected, key)) > 5.0
    ]


def test_latency_percentiles_match_scripted_delays(fake_server) -> None:
    """TTFT/ITL/TPOT/E2E percentiles agree with the script within 5 ms.

    ITL and TPOT are checked against the scripted 20 ms directly. TTFT and E2E also hold the
    request's own HTTP transfer and routing before the script starts (real latency that the
    harness must count), so every statistic is also checked against the times at which the
    server actually sent each chunk, read on the same monotonic clock as the client's.

    On a CPU shared with other jobs the OS can park the client (or the server) for tens of ms,
    which moves a p99 and is no error of the harness; so up to three runs are made and one of
    them must match everywhere.
    """
    mismatches: list[str] = []
    for _ in range(3):
        mismatches = _timing_mismatches(fake_server, ttft_ms=100, itl_ms=20, n=8)
        if not mismatches:
            break
    assert not mismatches


def test_replay_is_deterministic_in_order_and_content(fake_server) -> None:
    requests = [chat(i, max_tokens=2 + i % 3) for i in range(6)]
    url = fake_server.url("ok", 1, 1)
    first = plan_requests(requests, base_url=url, model="fake-model", arrival=closed(1))
    again = plan_requests(requests, base_url=url, model="fake-model", arrival=closed(1))
    assert [(p.url, p.headers, p.body) for p in first] == [(p.url, p.headers, p.body) for p in again]
    seen = []
    for _ in range(2):
        fake_server.clear_log()
        result = asyncio.run(run_load(first, closed(1), QUIET))
        assert [r.request_id for r in result.records] == [r.id for r in requests]
        seen.append([(e["request_id"], e["body"]) for e in fake_server.log()])
    assert seen[0] == seen[1]
    assert seen[0] == [(r.id, request_body(r, "fake-model", BodyOptions())) for r in requests]


def test_cancellation_closes_the_connection(fake_server) -> None:
    fake_server.clear_log()
    requests = [chat(0, max_tokens=40, cancel_after_tokens=3), chat(1, max_tokens=40, cancel_after_tokens=0)]
    result = run(requests, fake_server.url("ok", 50, 20), closed(2))
    by_id = {r.request_id: r for r in result.records}
    assert by_id["req-0"].outcome is Outcome.CANCELLED and by_id["req-0"].num_content_chunks == 3
    assert by_id["req-1"].outcome is Outcome.CANCELLED and by_id["req-1"].num_content_chunks == 0
    # The server saw the disconnect and stopped generating (it would have sent 40 tokens).
    assert fake_server.wait_for("req-0", "disconnected")["tokens_sent"] < 40
    assert fake_server.wait_for("req-1", "disconnected")["tokens_sent"] < 40
    group = GroupReport.of(result.records, result.duration_s, SLO())
    assert (group.ok, group.cancelled, group.errors_by_status) == (2, 2, {})
    assert group.e2e_ms.count == 0 and group.ttft_ms.count == 1 and group.itl_ms.count == 2


def test_failing_server_is_recorded_per_status(fake_server) -> None:
    requests = [chat(i, max_tokens=6) for i in range(10)]  # flaky: ok, 500, 429, reset, garbage, ...
    result = run(requests, fake_server.url("flaky", 5, 5), closed(3))
    group = GroupReport.of(result.records, result.duration_s, SLO())
    assert group.requests == 10 and group.ok == 2
    assert group.errors_by_status == {"429": 2, "500": 2, "connection_error": 2, "stream_error": 2}
    by_id = {r.request_id: r for r in result.records}
    assert by_id["req-1"].status_code == 500 and "scripted 500" in (by_id["req-1"].error or "")
    assert by_id["req-3"].status_code == 200 and by_id["req-3"].num_content_chunks == 3


def test_stream_without_end_and_timeouts(fake_server) -> None:
    nodone = run([chat(0, max_tokens=3)], fake_server.url("nodone", 5, 5), closed(1))
    assert nodone.records[0].error_key == "stream_error"
    hang = run(
        [chat(1)], fake_server.url("hang", 5, 5), closed(1), LoadOptions(timeout_s=0.3, progress=False)
    )
    assert hang.records[0].outcome is Outcome.TIMEOUT and hang.records[0].error_key == "timeout"


def test_connection_refused_does_not_crash() -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run([chat(0), chat(1)], f"http://127.0.0.1:{port}", closed(2))
    assert [r.error_key for r in result.records] == ["connection_error", "connection_error"]
    assert all(r.status_code == 0 for r in result.records)


def test_max_duration_bounds_the_run(fake_server) -> None:
    requests = [chat(0), chat(1, t=30.0)]  # the second is due long after the deadline
    opts = LoadOptions(timeout_s=30.0, max_duration_s=0.4, progress=False)
    result = run(requests, fake_server.url("hang", 5, 5), ArrivalSpec(), opts)
    assert result.num_planned == 2
    assert [(r.request_id, r.outcome) for r in result.records] == [("req-0", Outcome.DEADLINE)]
    assert GroupReport.of(result.records, result.duration_s, SLO()).errors_by_status == {"deadline": 1}


def test_after_waits_for_the_previous_turn(fake_server) -> None:
    requests = [chat(0, max_tokens=5), chat(1, max_tokens=2, after="req-0")]
    result = run(requests, fake_server.url("ok", 20, 20), ArrivalSpec(rate_scale=1.0))
    first, second = result.records
    assert second.start_s >= first.end_s - 1e-6


def test_trace_arrivals_follow_the_scaled_schedule(fake_server) -> None:
    requests = [chat(i, max_tokens=1, t=0.2 * i) for i in range(3)]
    result = run(requests, fake_server.url("ok", 1, 1), ArrivalSpec(rate_scale=2.0))
    assert [r.scheduled_s for r in result.records] == [0.0, 0.1, 0.2]
    assert all(r.start_s >= r.scheduled_s for r in result.records)
    assert json.loads(plan_requests(requests, base_url="http://x", model="m", arrival=ArrivalSpec())[0].body)
