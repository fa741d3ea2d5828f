"""A real `weir serve` in a child process on 127.0.0.1, for benchmarks and end-to-end tests.

It gets its own data dir (a fresh SQLite database), a known admin token (WEIR_ADMIN_TOKEN in its
environment, never on the command line), keys on, and a free API port and metrics port. Stopped
with SIGTERM (a graceful drain), then killed if it does not exit.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WeirProcess:
    """A running `weir serve`."""

    proc: subprocess.Popen[bytes]
    url: str  # the API root, e.g. http://127.0.0.1:41234
    metrics_url: str  # http://127.0.0.1:P/metrics on the metrics listener
    admin_token: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def admin_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin_token}"}


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"weir serve exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"weir serve was not ready after {timeout_s:.0f}s; see {log_path}")


@contextlib.contextmanager
def run_weir(
    model: Path,
    data_dir: Path,
    flags: Sequence[str] = (),
    *,
    log_path: Path | None = None,
    start_timeout_s: float = 120.0,
    stop_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[WeirProcess]:
    """Start `weir serve --model model` (keys on) and stop it on exit; `env` adds variables
    (e.g. WEIR_KEY_PEPPER, which has no flag)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or data_dir / "server.log"
    token = secrets.token_hex(24)  # never starts with "-", which argparse would take for a flag
    port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "weir.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port), "--data-dir", str(data_dir), "--model", str(model)]
    cmd += ["--auth", "keys", "--log-level", "warning", *flags]
    env = {**os.environ, **(env or {}), "WEIR_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(url, proc, start_timeout_s, log_path)
            yield WeirProcess(proc, url, f"http://127.0.0.1:{metrics_port}/metrics", token, log_path)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=stop_timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def resolve_model(model: Path | None, work_dir: Path) -> Path:
    """`model`, else a random 2-layer Llama (built once in work_dir) with SmolLM2's tokenizer."""
    if model is not None:
        return model
    from weir.engine.runner.model_prepare import ensure_default_model
    from weir.gateway.settings.settings import Settings
    from weir_bench.random_model import make_tiny_llama

    tokenizer_dir = ensure_default_model(Settings.from_environment().cache_dir, progress=False)
    return make_tiny_llama(work_dir / "tiny-llama", tokenizer_dir)


def scrape_gauges(metrics_url: str, names: Sequence[str]) -> dict[str, float]:
    """The samples `names` of one scrape of the metrics listener (see `parse_gauges`)."""
    return parse_gauges(httpx.get(metrics_url, timeout=10).raise_for_status().text, names)


def parse_gauges(text: str, names: Sequence[str]) -> dict[str, float]:
    """The samples `names` of a Prometheus text page: unlabelled ones, or labelled only by
    `model_version` (per-engine gauges; with several versions loaded, the last one read)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names and set(sample.labels) <= {"model_version"}:
                found[sample.name] = sample.value
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
