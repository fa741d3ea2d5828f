"""The noisy-neighbour benchmark: the same trace against `weir serve` twice, side by side.

1. `admission`: token budgets + SLO-aware admission + the fair-share queue (the defaults);
2. `baseline`: admission off + FCFS (a shared queue, as if there were no tenancy).

Each run starts a fresh `weir serve` (its own SQLite data dir, API keys), creates the tenants of
`tenants.json` through the admin API, replays `noisy.jsonl` with `weir bench serve`, scrapes
`/metrics`, and stops the server. Then `summary.json` / `summary.md` compare the two runs on the
issue's targets:

- `quiet` keeps TTFT p99 <= its SLO (2,000 ms) with zero rejections;
- `noisy` is held to its budget within 5%: tokens served <= 1.05 x (a full minute's bucket plus
  the refill over the arrival span of the trace).

Run: python -m weir_bench.experiments.noisy_neighbor --out bench-out/noisy [--model PATH] [--limit N] [--rate-scale X]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from weir_bench.random_model import make_tiny_llama

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT.parent / "shared" / "workloads"
QUIET, NOISY = "quiet", "noisy"


@dataclass(frozen=True)
class Mode:
    """One side of the comparison."""

    name: str
    serve_flags: tuple[str, ...]


MODES = (
    Mode("admission", ("--admission", "on", "--queue-policy", "fair")),
    Mode("baseline", ("--admission", "off", "--queue-policy", "fcfs")),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weir serve exited with {proc.returncode}; see its server.log")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"weir serve was not ready after {timeout_s:.0f}s")


def serve_command(
    args: argparse.Namespace, mode: Mode, port: int, data_dir: Path, metrics_port: int = 0
) -> list[str]:
    """The `weir serve` command line of one run (0: no metrics listener, /metrics with the admin token)."""
    cmd = [sys.executable, "-m", "weir.cli", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    cmd += ["--metrics-port", str(metrics_port)]
    cmd += ["--auth", "keys", "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    cmd += ["--max-num-seqs", str(args.max_num_seqs), "--log-level", "warning", *mode.serve_flags]
    if args.model:
        cmd += ["--model", str(args.model)]
    if args.kv_cache_tokens:
        cmd += ["--kv-cache-tokens", str(args.kv_cache_tokens)]
    return cmd


def bench_command(args: argparse.Namespace, mode: Mode, url: str, out: Path) -> list[str]:
    """The `weir bench serve` command line of one run (the admin token comes from the env)."""
    cmd = [sys.executable, "-m", "weir_bench", "serve", "--url", url, "--workload", str(args.workload)]
    cmd += ["--tenants", str(args.tenants), "--create-tenants", "--admin-token", "$WEIR_ADMIN_TOKEN"]
    cmd += ["--out", str(out), "--ttft-slo-ms", str(args.ttft_slo_ms), "--timeout-s", str(args.timeout_s)]
    cmd += ["--max-duration-s", str(args.max_duration_s), "--label", f"mode={mode.name}", "--no-progress"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.rate_scale != 1.0:
        cmd += ["--rate-scale", str(args.rate_scale)]
    return cmd


def run_mode(args: argparse.Namespace, mode: Mode) -> Path:
    """Serve, load, scrape, stop; the run's output folder."""
    out = args.out / mode.name
    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(24)  # never starts with "-", which argparse would take for a flag
    env = {**os.environ, "WEIR_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = serve_command(args, mode, port, out / "data")
    (out / "commands.txt").write_text(
        "WEIR_ADMIN_TOKEN=... "
        + shlex.join(serve)
        + "\n"
        + shlex.join(bench_command(args, mode, url, out))
        + "\n"
    )
    print(f"[{mode.name}] {shlex.join(serve)}", flush=True)
    with (out / "server.log").open("wb") as log:
        proc = subprocess.Popen(serve, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(url, proc, args.start_timeout_s)
            bench = [token if a == "$WEIR_ADMIN_TOKEN" else a for a in bench_command(args, mode, url, out)]
            subprocess.run(bench, cwd=ROOT, env=env, check=True)
            # /metrics names every tenant: on the API port it needs the admin token.
            scrape = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
            (out / "metrics.txt").write_text(scrape.raise_for_status().text)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


def arrival_span_s(workload: Path, tenant: str, limit: int | None, rate_scale: float) -> float:
    """Seconds between the run's start and the tenant's last arrival (bench sends at t / scale)."""
    rows = sorted((json.loads(line) for line in workload.read_text().splitlines() if line.strip()),
                  key=lambda r: r["t"])  # fmt: skip
    if limit:
        rows = rows[:limit]
    times = [r["t"] for r in rows if r["tenant"] == tenant]
    return max(times, default=0.0) / rate_scale


def tenant_quota(tenants: Path, name: str) -> dict[str, Any]:
    for t in json.loads(tenants.read_text()):
        if t["name"] == name:
            return dict(t.get("quota", {}))
    raise KeyError(name)


def summarize(args: argparse.Namespace, outs: dict[str, Path]) -> dict[str, Any]:
    """The issue's targets for each run, from the reports."""
    tpm = tenant_quota(args.tenants, NOISY)["tokens_per_minute"]
    span = arrival_span_s(args.workload, NOISY, args.limit, args.rate_scale)
    allowance = tpm * (1 + span / 60.0)
    summary: dict[str, Any] = {
        "noisy_allowance_tokens": round(allowance),
        "noisy_arrival_span_s": round(span, 2),
    }
    for name, out in outs.items():
        report = json.loads((out / "report.json").read_text())
        quiet, noisy = report["tenants"].get(QUIET, {}), report["tenants"].get(NOISY, {})
        served = noisy.get("prompt_tokens", 0) + noisy.get("output_tokens", 0)
        summary[name] = {
            "quiet_requests": quiet.get("requests"),
            "quiet_ok": quiet.get("ok"),
            "quiet_ttft_p50_ms": quiet.get("ttft_ms", {}).get("p50"),
            "quiet_ttft_p99_ms": quiet.get("ttft_ms", {}).get("p99"),
            "quiet_errors": quiet.get("errors_by_status", {}),
            "noisy_requests": noisy.get("requests"),
            "noisy_ok": noisy.get("ok"),
            "noisy_errors": noisy.get("errors_by_status", {}),
            "noisy_tokens_served": served,
            "noisy_budget_ratio": round(served / allowance, 4) if allowance else None,
            "quiet_target_met": bool(
                quiet.get("ok") == quiet.get("requests")
                and (quiet.get("ttft_ms", {}).get("p99") or 0) <= args.ttft_slo_ms
            ),
            "noisy_target_met": served <= 1.05 * allowance,
        }
    return summary


def render(summary: dict[str, Any], modes: list[str]) -> str:
    rows = [
        ("quiet TTFT p50 (ms)", "quiet_ttft_p50_ms"),
        ("quiet TTFT p99 (ms)", "quiet_ttft_p99_ms"),
        ("quiet ok / requests", None),
        ("quiet errors", "quiet_errors"),
        ("noisy ok / requests", None),
        ("noisy errors", "noisy_errors"),
        ("noisy tokens served", "noisy_tokens_served"),
        ("noisy tokens / allowance", "noisy_budget_ratio"),
        ("quiet target met", "quiet_target_met"),
        ("noisy target met", "noisy_target_met"),
    ]
    lines = ["| | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for label, key in rows:
        cells = []
        for m in modes:
            s = summary[m]
            if key is None:
                who = "quiet" if label.startswith("quiet") else "noisy"
                cells.append(f"{s[who + '_ok']} / {s[who + '_requests']}")
            else:
                cells.append(str(s[key]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"noisy allowance: {summary['noisy_allowance_tokens']} tokens (a full minute plus the refill over "
        f"{summary['noisy_arrival_span_s']} s of arrivals)"
    )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.noisy_neighbor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="output folder (one sub-folder per run)")
    p.add_argument("--model", type=Path, help="model folder (default: weir's prepared SmolLM2)")
    p.add_argument(
        "--tiny-model",
        type=Path,
        metavar="DIR",
        help="serve a random 2-layer Llama saved here (built once, tokenizer of --model): for CPUs",
    )
    p.add_argument("--workload", type=Path, default=WORKLOADS / "noisy.jsonl")
    p.add_argument("--tenants", type=Path, default=WORKLOADS / "tenants.json")
    p.add_argument("--limit", type=int, help="only the first N requests of the trace")
    p.add_argument(
        "--rate-scale", type=float, default=1.0, help="arrival rate multiplier (0.5: half as fast)"
    )
    p.add_argument("--modes", default="admission,baseline", help="comma-separated: admission, baseline")
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0, help="quiet's TTFT objective")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per-request limit of the load generator")
    p.add_argument("--max-duration-s", type=float, default=600.0, help="whole-run limit of each load")
    p.add_argument("--max-num-batched-tokens", type=int, default=256, help="bounds one step's latency on CPU")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--kv-cache-tokens", type=int, default=32_768)
    p.add_argument("--start-timeout-s", type=float, default=300.0, help="model load and warm-up")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tiny_model is not None:
        if args.model is None:
            raise SystemExit("--tiny-model needs --model (whose tokenizer it uses)")
        args.model = make_tiny_llama(args.tiny_model, args.model)
    wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
    outs = {m.name: run_mode(args, m) for m in MODES if m.name in wanted}
    summary = summarize(args, outs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = render(summary, list(outs))
    (args.out / "summary.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
