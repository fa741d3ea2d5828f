"""The shared KV store tier across replicas (issue 56): three `weir serve` replicas on one
redis-server, against the same three without the store and against one replica.

    python -m weir_bench.experiments.kv_store [--model PATH] [--limit N] [--out DIR]

Each arm starts its replicas (real `weir serve` processes: the real SmolLM2 in float32 by
default, `--model` otherwise; each its own SQLite database with the trace's tenants created
through the admin API, so a tenant's cache scope is its name on every replica) and replays
`shared/workloads/prefix.jsonl` one request at a time (a closed loop, so the figures are not
queueing), request i to replica i % replicas, streaming, with usage in the last chunk:

- `one`: one replica, no store (every repeated prefix is a local hit);
- `replicas`: three replicas, no store (a prefix is computed again on every replica);
- `replicas+store`: three replicas, `--kv-store` on one redis-server (started here, on a free
  127.0.0.1 port, in a temporary directory); with `--stop-store-at F` the store is stopped after
  that share of the requests, and the rest must still be answered.

Reported per arm: failed requests, the cached share of prompt tokens, TTFT percentiles; and for
the requests whose system prompt (the shared prefix) was first computed on another replica
("cross-replica" requests: a miss without the store, a store hit with it), their TTFT p50 in
`replicas+store` against the same requests' in `replicas` (recompute). The targets: cached share
>= 0.9x `one`'s; that TTFT ratio <= 0.4; no failed request with the store stopped. Also the
fetch bandwidth and the recompute rate that decided the fetches (from the replicas' /metrics).
Writes summary.json and summary.md to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.sse import SSEDecoder
from weir_bench.stats import LatencySummary
from weir_bench.weir_process import WeirProcess, free_port, parse_gauges, run_weir
from weir_bench.workloads import WorkloadRequest, load_trace, take

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT.parent / "shared" / "workloads" / "prefix.jsonl"
SECRET = "kv-store-experiment-mac-secret-0123456789"
SERVED = "smol"
ARMS = ("one", "replicas", "replicas+store")


@dataclass
class Answer:
    """One request's outcome."""

    request_id: str
    replica: int
    ok: bool
    ttft_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


@dataclass
class ArmResult:
    arm: str
    answers: list[Answer] = field(default_factory=list)
    store_stopped_after: int | None = None
    fetch_bytes_per_s: float | None = None
    decision_recompute_tokens_per_s: float | None = None

    def cached_share(self) -> float:
        prompt = sum(a.prompt_tokens for a in self.answers if a.ok)
        return sum(a.cached_tokens for a in self.answers if a.ok) / prompt if prompt else 0.0

    def to_json(self, cross: set[str]) -> dict[str, Any]:
        ok = [a for a in self.answers if a.ok]
        return {
            "arm": self.arm,
            "requests": len(self.answers),
            "failed": len(self.answers) - len(ok),
            "errors": sorted({a.error for a in self.answers if not a.ok})[:5],
            "cached_share_of_prompt_tokens": round(self.cached_share(), 4),
            "ttft_ms": LatencySummary.of(a.ttft_s * 1e3 for a in ok if a.ttft_s is not None).to_json(),
            "cross_replica_ttft_ms": LatencySummary.of(
                a.ttft_s * 1e3 for a in ok if a.ttft_s is not None and a.request_id in cross
            ).to_json(),
            "store_stopped_after": self.store_stopped_after,
            "fetch_bytes_per_s": self.fetch_bytes_per_s,
            "decision_recompute_tokens_per_s": self.decision_recompute_tokens_per_s,
        }


def prefix_of(req: WorkloadRequest) -> tuple[str, str]:
    """The shared prefix of a trace request: its tenant and its system message."""
    system = next((m.content for m in req.messages if m.role == "system"), "")
    return req.tenant, str(system)


def cross_replica_ids(requests: Sequence[WorkloadRequest], num_replicas: int) -> set[str]:
    """Requests whose prefix was already sent, but only ever to other replicas (round robin)."""
    seen: dict[tuple[str, str], set[int]] = {}
    out: set[str] = set()
    for i, req in enumerate(requests):
        replica = i % num_replicas
        where = seen.setdefault(prefix_of(req), set())
        if where and replica not in where:
            out.add(req.id)
        where.add(replica)
    return out


def send(client: httpx.Client, key: str, req: WorkloadRequest, replica: int, max_tokens: int) -> Answer:
    """One streamed chat completion: TTFT, prompt and cached tokens."""
    body = {
        "model": SERVED,
        "messages": [{"role": m.role, "content": m.content} for m in req.messages],
        "max_tokens": min(req.max_tokens, max_tokens),
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer = Answer(req.id, replica, ok=False)
    t0 = time.perf_counter()
    try:
        with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r:
            if r.status_code != 200:
                answer.error = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                return answer
            decoder = SSEDecoder()
            for line in r.iter_lines():
                data = decoder.feed(line)
                if data is None or data == "[DONE]":
                    continue
                obj = json.loads(data)
                if "error" in obj:
                    answer.error = json.dumps(obj["error"])[:200]
                    return answer
                for choice in obj.get("choices") or []:
                    if answer.ttft_s is None and (choice.get("delta") or {}).get("content"):
                        answer.ttft_s = time.perf_counter() - t0
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    answer.cached_tokens = int(details.get("cached_tokens") or 0)
        answer.ok = True
    except (httpx.HTTPError, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    return answer


def _tenant_keys(replica: WeirProcess, tenants: Sequence[str]) -> dict[str, str]:
    keys = {}
    with httpx.Client(base_url=replica.url, headers=replica.admin_headers(), timeout=60) as admin:
        for tenant in tenants:
            admin.post("/admin/v1/tenants", json={"name": tenant}).raise_for_status()
            keys[tenant] = str(admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"])
    return keys


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A throw-away redis-server (or valkey-server) on a free 127.0.0.1 port: its URL and process."""
    import redis

    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    proc = subprocess.Popen(
        [*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        ping = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if ping.ping():
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(10)


def run_arm(
    arm: str,
    model: Path,
    requests: Sequence[WorkloadRequest],
    work_dir: Path,
    args: argparse.Namespace,
) -> ArmResult:
    num_replicas = 1 if arm == "one" else args.replicas
    flags = [
        "--served-model-name",
        SERVED,
        "--dtype",
        "float32",
        "--kv-cache-tokens",
        str(args.kv_cache_tokens),
    ]
    result = ArmResult(arm)
    tenants = sorted({r.tenant for r in requests})
    with contextlib.ExitStack() as stack:
        store = None
        if arm == "replicas+store":
            url, store = stack.enter_context(redis_server(work_dir))
            flags += ["--kv-store", url]
        env = {"WEIR_KV_STORE_SECRET": SECRET}
        replicas = [
            stack.enter_context(run_weir(model, work_dir / f"{arm}-{i}", flags, env=env, start_timeout_s=600))
            for i in range(num_replicas)
        ]
        keys = [_tenant_keys(r, tenants) for r in replicas]
        clients = [stack.enter_context(httpx.Client(base_url=r.url, timeout=600)) for r in replicas]
        stop_at = (
            int(args.stop_store_at * len(requests)) if store is not None and args.stop_store_at else None
        )
        for i, req in enumerate(requests):
            if stop_at is not None and i == stop_at and store is not None:
                store.terminate()
                store.wait(10)
                result.store_stopped_after = i
            j = i % num_replicas
            result.answers.append(send(clients[j], keys[j][req.tenant], req, j, args.max_tokens))
            print(f"{arm} {i + 1}/{len(requests)}: {result.answers[-1]}", file=sys.stderr, flush=True)
        if store is not None:
            names = [
                "weir_kv_store_fetch_bandwidth_bytes_per_second",
                "weir_kv_store_decision_recompute_tokens_per_second",
            ]
            gauges = [parse_gauges(httpx.get(r.metrics_url, timeout=10).text, names) for r in replicas]
            bw = [g[names[0]] for g in gauges if g.get(names[0])]
            rate = [g[names[1]] for g in gauges if g.get(names[1])]
            result.fetch_bytes_per_s = round(sum(bw) / len(bw)) if bw else None
            result.decision_recompute_tokens_per_s = round(sum(rate) / len(rate), 1) if rate else None
    return result


def summarize(results: dict[str, ArmResult], cross: set[str]) -> dict[str, Any]:
    """The arms' figures and the issue's three targets."""
    arms = {name: r.to_json(cross) for name, r in results.items()}
    out: dict[str, Any] = {"arms": arms, "num_cross_replica_requests": len(cross)}
    if "one" in results and "replicas+store" in results and results["one"].cached_share():
        out["cached_share_vs_one"] = round(
            results["replicas+store"].cached_share() / results["one"].cached_share(), 3
        )
    store_p50 = arms.get("replicas+store", {}).get("cross_replica_ttft_ms", {}).get("p50")
    recompute_p50 = arms.get("replicas", {}).get("cross_replica_ttft_ms", {}).get("p50")
    if store_p50 is not None and recompute_p50:
        out["cross_replica_ttft_p50_ratio"] = round(store_p50 / recompute_p50, 3)
    if "replicas+store" in arms:
        out["failed_with_store"] = arms["replicas+store"]["failed"]
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| arm | requests | failed | cached share | TTFT p50 ms | cross-replica TTFT p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for a in summary["arms"].values():
        lines.append(
            f"| {a['arm']} | {a['requests']} | {a['failed']} | {a['cached_share_of_prompt_tokens']:.3f} | "
            f"{a['ttft_ms']['p50']} | {a['cross_replica_ttft_ms']['p50']} |"
        )
    for key in ("cached_share_vs_one", "cross_replica_ttft_p50_ratio", "failed_with_store"):
        if key in summary:
            lines.append(f"\n{key}: {summary[key]}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="default: SmolLM2-135M-Instruct (prepared)")
    p.add_argument("--workload", type=Path, default=WORKLOAD)
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument("--max-tokens", type=int, default=16, help="cap each request's max_tokens")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument(
        "--stop-store-at", type=float, default=0.0, help="stop the store after this share of requests"
    )
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--out", type=Path, default=Path("bench-out/kv_store"))
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if any(a not in ARMS for a in arms) or args.replicas < 2:
        p.error(f"--arms must name {', '.join(ARMS)}; --replicas must be >= 2")
    model = args.model
    if model is None:
        from weir.engine.runner.model_prepare import ensure_default_model
        from weir.gateway.settings.settings import Settings

        model = ensure_default_model(Settings.from_environment().cache_dir, progress=False)
    requests = take(load_trace(args.workload), args.limit)
    cross = cross_replica_ids(requests, args.replicas)
    results: dict[str, ArmResult] = {}
    with tempfile.TemporaryDirectory(prefix="weir-kv-store-") as tmp:
        for arm in arms:
            results[arm] = run_arm(arm, model, requests, Path(tmp), args)
    summary = summarize(results, cross)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
