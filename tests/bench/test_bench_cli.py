"""weir_bench.cli: `bench serve` end to end against the fake server, `bench gen`, `python -m weir_bench`.

(Named test_bench_cli.py, not test_cli.py, so it never collides with another package's CLI test.)
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from weir_bench.cli import add_subcommands, main
from weir_bench.workloads import load_trace

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_workload(path: Path) -> Path:
    lines = [
        {"id": f"w-{i}", "t": 0.05 * i, "tenant": ["acme", "globex"][i % 2], "priority": "interactive",
         "kind": "chat" if i % 3 else "completion", "max_tokens": 3, "ignore_eos": True,
         **({"messages": [{"role": "user", "content": f"q {i}"}]} if i % 3 else {"prompt": f"p {i}"})}
        for i in range(5)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_serve_with_created_tenants(fake_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = write_workload(tmp_path / "w.jsonl")
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps([{"name": "acme", "priority": "interactive"}, {"name": "globex"}]))
    out = tmp_path / "run"
    fake_server.clear_log()
    argv = [
        "serve", "--url", fake_server.url("ok", 5, 5) + "/v1", "--workload", str(workload), "--out", str(out),
        "--tenants", str(tenants), "--create-tenants", "--admin-token", "admin-secret", "--limit", "4",
        "--concurrency", "2", "--ttft-slo-ms", "1000", "--label", "dtype=bf16", "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    assert "4/4 ok" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert names == {"report.json", "report.md", "requests.jsonl", "latency_cdf.png", "throughput.png"}
    assert (out / "throughput.png").read_bytes()[:8] == PNG_SIGNATURE
    report = json.loads((out / "report.json").read_text())
    assert set(report["tenants"]) == {"acme", "globex"} and report["overall"]["ok"] == 4
    assert report["overall"]["output_tokens"] == 12 and report["overall"]["good_requests"] == 4
    meta = report["metadata"]
    assert (meta["model"], meta["batch_policy"], meta["dtype"]) == ("fake-model", "continuous", "bf16")
    assert (
        meta["arrival"] == {"mode": "concurrency", "concurrency": 2} and meta["tenant_keys"] == "per_tenant"
    )
    assert "admin-secret" not in meta["command"] and "--admin-token REDACTED" in meta["command"]
    assert len((out / "requests.jsonl").read_text().splitlines()) == 4
    # Each request carried its own tenant's key, created through the admin API.
    for entry in fake_server.log():
        tenant = "acme" if int(entry["request_id"].split("-")[1]) % 2 == 0 else "globex"
        assert entry["authorization"].startswith(f"Bearer sk-{tenant}-")
        assert entry["body"]["stream_options"] == {"include_usage": True}


def test_serve_refuses_a_tenant_without_key(
    fake_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps([{"name": "acme", "api_key": "sk-a"}]))
    argv = ["serve", "--url", fake_server.url(), "--workload", str(write_workload(tmp_path / "w.jsonl")),
            "--out", str(tmp_path / "run"), "--tenants", str(tenants), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "globex" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_serve_against_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    base = ["serve", "--url", url, "--workload", str(write_workload(tmp_path / "w.jsonl")), "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 2  # no model to be found
    assert "--model" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--model", "m", "--rate", "50", "--limit", "2"]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["overall"]["errors_by_status"] == {"connection_error": 2} and report["overall"]["ok"] == 0


@pytest.mark.parametrize("kind", ["random", "shared-prefix", "multi-turn"])
def test_gen_writes_replayable_traces(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["gen", kind, "--out", str(out), "--n", "5", "--tenants", "a,b", "--seed", "2"]) == 0
    first = out.read_bytes()
    reqs = load_trace(out)
    assert len(reqs) == (20 if kind == "multi-turn" else 5) and {r.tenant for r in reqs} <= {"a", "b"}
    assert main(["gen", kind, "--out", str(out), "--n", "5", "--tenants", "a,b", "--seed", "2"]) == 0
    assert out.read_bytes() == first


def test_subcommands_attach_to_another_cli() -> None:
    parser = argparse.ArgumentParser(prog="weir")
    bench = parser.add_subparsers(dest="cmd").add_parser("bench").add_subparsers(dest="bench_cmd")
    add_subcommands(bench)
    args = parser.parse_args(["bench", "compare", "a.json", "b.json"])
    assert args.func.__name__ == "compare_command"


def test_python_dash_m_bench() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "weir_bench", "serve", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--rate-scale" in done.stdout and "--tenants" in done.stdout
