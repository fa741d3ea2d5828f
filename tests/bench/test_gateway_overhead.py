"""`weir bench overhead`: a short run against the real gateway produces the report (no timings asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.tiny_tokenizer import build_tokenizer
from weir_bench.cli import main
from weir_bench.gateway_overhead import AuthSetup, LoadClient, OverheadConfig, PhaseResult, Scenario
from weir_bench.overhead_command import build_report, format_markdown, run_overhead

SUMMARY_KEYS = {"p50", "p90", "p99", "mean"}
PHASE_KEYS = {
    "sent",
    "ok",
    "errors",
    "achieved_rate",
    "latency_ms",
    "first_chunk_ms",
    "in_app_ms",
    "send_lag_ms",
    "server_cpu_ms_per_request",
    "client_cpu_ms_per_request",
    "load_average_1m",
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder holding only the tiny tokenizer (the server needs nothing else)."""
    path = tmp_path_factory.mktemp("tiny-model")
    build_tokenizer().save_pretrained(str(path))
    return path


def _check_report(report: dict, modes: list[str], num_requests: int) -> None:
    assert set(report) == {"config", "metadata", "servers", "overhead", "reference"}
    assert {"date", "command", "commit", "machine", "load_average_before", "load_average_after"} <= set(
        report["metadata"]
    )
    assert list(report["servers"]) == modes
    for mode in modes:
        phases = report["servers"][mode]
        assert list(phases) == ["health", "chat", "chat_stream"]
        for phase in phases.values():
            assert set(phase) == PHASE_KEYS
            assert phase["sent"] == num_requests
            assert phase["ok"] == num_requests, phase["errors"]
            assert phase["errors"] == {}
            for key in ("latency_ms", "in_app_ms", "send_lag_ms"):
                assert set(phase[key]) == SUMMARY_KEYS
                assert phase[key]["p50"] is not None
        assert phases["chat"]["first_chunk_ms"] is None
        assert phases["chat_stream"]["first_chunk_ms"]["p50"] is not None
        assert list(report["overhead"][mode]) == ["chat", "chat_stream"]
        overhead = report["overhead"][mode]
        assert set(overhead["chat"]) == {"raw_ms", "minus_floor_ms", "in_app_ms"}
        assert set(overhead["chat_stream"]) == set(overhead["chat"]) | {
            "first_chunk_ms",
            "first_chunk_minus_floor_ms",
        }
        for figures in overhead.values():
            assert set(figures["minus_floor_ms"]) == SUMMARY_KEYS


def test_cli_run_writes_json_and_markdown(tokenizer_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["overhead", "--model", str(tokenizer_dir), "--out", str(out), "--requests", "8"]
    argv += ["--warmup", "2", "--rate", "100", "--auth", "none", "--output-tokens", "3"]
    argv += ["--gil-switch-interval-ms", "0.25"]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    _check_report(report, ["none"], 8)
    assert report["config"]["output_tokens"] == 3
    assert report["config"]["gil_switch_interval_ms"] == 0.25
    assert "overhead" in report["metadata"]["command"]
    markdown = (out / "report.md").read_text()
    assert "| none | chat_stream | 8/8 |" in markdown
    assert "GIL switch interval 0.25 ms" in markdown
    assert (out / "server-none.log").exists()


@pytest.mark.slow
def test_keys_mode_authenticates_with_a_tenant_key(tokenizer_dir: Path, tmp_path: Path) -> None:
    # ok == sent proves every request carried a key the SQLite tenancy accepted (else 401s).
    # With httpx as the load client, so both clients run end to end.
    config = OverheadConfig(
        model=tokenizer_dir,
        out_dir=tmp_path,
        rate=100,
        num_requests=6,
        num_warmup=1,
        auth=(AuthSetup.KEYS,),
        client=LoadClient.HTTPX,
    )
    _check_report(run_overhead(config), ["keys"], 6)


def test_a_model_folder_without_a_tokenizer_is_exit_status_2(tmp_path: Path) -> None:
    # The server process exits at start-up; the run stops there with the reason, not a hang.
    (tmp_path / "empty").mkdir()
    argv = ["overhead", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]
    assert main([*argv, "--requests", "1", "--warmup", "0", "--auth", "none"]) == 2
    assert (tmp_path / "out" / "server-none.log").read_text()  # the server's traceback


def test_a_missing_model_folder_is_exit_status_2(tmp_path: Path) -> None:
    argv = ["overhead", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]
    assert main([*argv, "--requests", "1", "--auth", "none"]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("rate", 0.0), ("num_requests", 0), ("num_warmup", -1), ("max_duration_s", 0.0), ("output_tokens", 0)]
    + [("gil_switch_interval_ms", 0.0)],
)
def test_config_names_the_bad_field(field: str, value: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=field):
        OverheadConfig(model=tmp_path, out_dir=tmp_path, **{field: value})


def test_report_subtracts_the_health_floor_per_percentile(tmp_path: Path) -> None:
    health = PhaseResult(Scenario.HEALTH, latencies_ms=[1.0] * 10, lags_ms=[0.0] * 10, num_sent=10)
    chat = PhaseResult(Scenario.CHAT, latencies_ms=[3.0] * 9 + [5.0], lags_ms=[0.0] * 10, num_sent=10)
    chat.errors["500"] += 1
    config = OverheadConfig(model=tmp_path, out_dir=tmp_path, scenarios=(Scenario.HEALTH, Scenario.CHAT))
    meta = {
        "date": "d",
        "command": "c",
        "commit": None,
        "machine": {"cpu": "x", "cores": 2, "memory_gb": 1, "python": "3"},
        "load_average_before": [0, 0, 0],
        "uvicorn_loop": "asyncio",
        "uvicorn_http": "httptools",
    }
    report = build_report(config, {AuthSetup.NONE: [health, chat]}, meta)
    figures = report["overhead"]["none"]["chat"]
    assert figures["raw_ms"]["p50"] == 3.0
    assert figures["minus_floor_ms"]["p50"] == 2.0
    assert report["servers"]["none"]["chat"]["errors"] == {"500": 1}
    assert "| none | chat | 10/10 | 3.00 |" in format_markdown(report)


def test_responses_scenarios_send_the_chats_prompt_to_v1_responses() -> None:
    import json

    chat = json.loads(Scenario.CHAT.body(7) or b"")
    whole = json.loads(Scenario.RESPONSES.body(7) or b"")
    streamed = json.loads(Scenario.RESPONSES_STREAM.body(7) or b"")
    assert Scenario.RESPONSES.path == Scenario.RESPONSES_STREAM.path == "/v1/responses"
    assert [whole["instructions"], whole["input"]] == [m["content"] for m in chat["messages"]]
    assert whole["max_output_tokens"] == 7 and "stream" not in whole and streamed["stream"] is True
    assert Scenario.RESPONSES_STREAM.stream and not Scenario.RESPONSES.stream
