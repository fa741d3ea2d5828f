"""What a report says about the run: the machine, the date, the command, the server's settings."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Flags whose values are secrets: the recorded command shows them as "REDACTED".
SECRET_FLAGS = ("--api-key", "--admin-token")

# Server-side settings a report should state, looked up in the labels first, then in the
# model's entry of GET /v1/models (top level, or under "weir" / "metadata").
SERVER_SETTINGS = ("batch_policy", "dtype", "kv_dtype", "max_model_len", "version")


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cpu_model() -> str:
    info = _read_text("/proc/cpuinfo")
    if info:
        for line in info.splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    info = _read_text("/proc/meminfo")
    if info:
        for line in info.splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1024 * 1024), 1)
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1024**3), 1)
    except (ValueError, OSError, AttributeError):
        return None


def _gpus() -> list[str]:
    """GPU names from nvidia-smi when present (the client machine; the server's when local)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine_info() -> dict[str, Any]:
    """The machine the harness runs on."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "gpus": _gpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


def git_commit(repo: Path | None = None) -> str | None:
    """The Weir commit the harness ran from, if it runs from a git checkout."""
    where = repo or Path(__file__).resolve().parent.parent
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def now_utc() -> str:
    """ISO 8601 date and time in UTC, to the second."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def redacted_command(argv: Sequence[str] | None = None) -> str:
    """The command line as run, secrets replaced, so a report can show its exact command."""
    args = list(sys.argv if argv is None else argv)
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append("REDACTED")
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}=REDACTED")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return shlex.join(out)


def server_settings(model_entry: Mapping[str, Any] | None, labels: Mapping[str, str]) -> dict[str, Any]:
    """Batch policy, dtype and the like: a `--label` wins, else what the server exposes."""
    found: dict[str, Any] = {}
    entry = dict(model_entry or {})
    nested = [entry] + [entry[k] for k in ("weir", "metadata") if isinstance(entry.get(k), dict)]
    for key in SERVER_SETTINGS:
        if key in labels:
            found[key] = labels[key]
            continue
        found[key] = next((d[key] for d in nested if key in d), None)
    return found
