"""weir_bench.experiments.serve_vs_peer: variants parsed, and a peer started by a tool script is stopped by
its PID (a fake tool: no guidellm, no peer build); a Weir variant is loaded through a tenant of the
class asked for (a real `weir serve` on a tiny model, a fake guidellm sending one request)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir_bench.experiments.serve_vs_peer import (
    bench_tenant,
    main,
    parse_args,
    parse_variant,
    run_guidellm,
    run_peer,
)
from weir_bench.weir_process import ROOT


def test_variants_split_flags_and_environment() -> None:
    assert parse_variant("weir=") == ("weir", [], {})
    assert parse_variant("step200=--target-step-ms 200") == ("step200", ["--target-step-ms", "200"], {})
    assert parse_variant("t1=OMP_NUM_THREADS=1 --target-step-ms 150") == (
        "t1",
        ["--target-step-ms", "150"],
        {"OMP_NUM_THREADS": "1"},
    )
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=FLAGS"):
        parse_variant("=--x")
    args = parse_args(["--peers", "--weir", "a=", "b=--target-step-ms 200"])
    assert args.peers == [] and [v[0] for v in args.weir] == ["a", "b"] and args.rounds == 1
    assert parse_args(["--rounds", "4"]).rounds == 4


def test_weir_is_measured_as_an_interactive_tenant_unless_told_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args([]).tenant_class == "interactive"  # the README's `--priority interactive`
    assert parse_args(["--tenant-class", "batch"]).tenant_class == "batch"
    assert bench_tenant("standard").priority == "standard"
    with pytest.raises(SystemExit):
        parse_args(["--tenant-class", "vip"])
    assert "--tenant-class" in capsys.readouterr().err


def _tools(tmp_path: Path, script: str, body: str) -> Path:
    """A tools folder holding one bash script `script` that runs `body`."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / script).write_text(f"#!/usr/bin/env bash\n{body}")
    return tools


def _peer_args(tmp_path: Path, script: str, body: str) -> argparse.Namespace:
    return argparse.Namespace(tools=_tools(tmp_path, script, body), peer_start_timeout_s=30.0)


def test_a_peer_is_stopped_by_the_pid_its_script_prints(tmp_path: Path) -> None:
    pid_file = tmp_path / "peer.pid"
    body = f'setsid sleep 300 >/dev/null 2>&1 &\necho $! > {pid_file}\necho "$! /models/smol"\n'
    with run_peer(_peer_args(tmp_path, "peer-tserve.sh", body), "tserve") as (url, model, peer_pid):
        assert url.startswith("http://127.0.0.1:") and model == "/models/smol"
        pid = int(pid_file.read_text())
        assert peer_pid == pid
        os.kill(pid, 0)  # running
    _assert_gone(pid)


def test_a_peer_script_runs_outside_the_repository(tmp_path: Path) -> None:
    # From the repository, a script's `python -c "import transformers"` would find Weir's kernels/.
    seen = tmp_path / "cwd"
    body = f'pwd > {seen}\nsetsid sleep 300 >/dev/null 2>&1 &\necho "$! /m"\n'
    with run_peer(_peer_args(tmp_path, "peer-tserve.sh", body), "tserve"):
        pass
    cwd = Path(seen.read_text().strip()).resolve()
    assert cwd != ROOT.resolve() and ROOT.resolve() not in cwd.parents


def test_a_peer_that_does_not_start_is_an_error_naming_it(tmp_path: Path) -> None:
    args = _peer_args(tmp_path, "peer-llama.sh", "echo 'build failed' >&2\nexit 1\n")
    with (
        pytest.raises(RuntimeError, match="llama-q4 did not start: build failed"),
        run_peer(args, "llama-q4"),
    ):
        pass


def test_a_guidellm_run_past_its_bound_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    args = argparse.Namespace(
        tools=_tools(tmp_path, "guidellm.sh", f"sleep 300 &\necho $! > {pid_file}\nwait\n"),
        out=tmp_path / "out",
        model=tmp_path,
        requests=1,
        streams=1,
        prompt_tokens=8,
        max_tokens=4,
        run_timeout_s=1.0,
    )
    args.out.mkdir()
    with pytest.raises(subprocess.TimeoutExpired):
        run_guidellm(args, "slow", "http://127.0.0.1:9", "m", None)
    _assert_gone(int(pid_file.read_text()))


# One streamed completion with the key and model serve_vs_peer hands guidellm, then a benchmarks.json
# of guidellm's shape; fails (so the run fails) if the server refused the request.
_FAKE_GUIDELLM = """\
import json, os, sys, httpx
base, out = sys.argv[1], sys.argv[3]
r = httpx.post(base + "/v1/completions", headers={"authorization": "Bearer " + os.environ["APIKEY"]},
               json={"model": os.environ["MODEL"], "prompt": "hello", "max_tokens": 2}, timeout=60)
r.raise_for_status()
s = {"successful": {"mean": 1.0, "median": 1.0, "percentiles": {"p99": 1.0}}}
m = {"request_totals": {"successful": 1, "errored": 0}, "output_tokens_per_second": s,
     "inter_token_latency_ms": s, "time_to_first_token_ms": s}
os.makedirs(out, exist_ok=True)
json.dump({"benchmarks": [{"metrics": m}]}, open(os.path.join(out, "benchmarks.json"), "w"))
"""


@pytest.mark.slow
def test_a_weir_variant_is_loaded_through_a_tenant_of_the_class_asked_for(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "model", arch="llama", num_kv_heads=2, max_position_embeddings=256)
    (tmp_path / "guidellm.py").write_text(_FAKE_GUIDELLM)
    tools = _tools(tmp_path, "guidellm.sh", f'exec {sys.executable} {tmp_path / "guidellm.py"} "$@"\n')
    out = tmp_path / "out"
    flags = ["--out", str(out), "--model", str(model), "--tools", str(tools), "--peers"]
    assert main([*flags, "--weir", "weir=--kv-cache-tokens 2048", "--tenant-class", "batch"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tenant_class"] == "batch"
    [[row]] = summary["rounds"]
    assert row["tenant_class"] == "batch" and row["num_ok"] == 1
    # the server admitted the request as a batch tenant's, none as another class's
    admitted = {k: v for k, v in row["server_gauges"].items() if k.startswith("admitted_")}
    assert admitted == {"admitted_batch": 1.0}
    text = (out / "summary.md").read_text()
    assert "| weir | batch |" in text and "weir requests admitted by tenant class: batch 1" in text


def _assert_gone(pid: int) -> None:
    """Killed, and reaped by init shortly after (a zombie still answers signal 0)."""
    for _ in range(100):
        try:
            os.kill(pid, 0)
            if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} is still running")
