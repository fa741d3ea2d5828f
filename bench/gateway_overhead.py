"""`weir bench overhead`: what the gateway adds to each request, against a zero-cost engine.

The real gateway (`bench.overhead_server`: create_app, the model's tokenizer and chat template,
the SQLite tenancy, uvicorn) runs over `NullEngine` in a subprocess on 127.0.0.1. This process
drives it open-loop at a fixed rate, one scenario at a time, with a lean HTTP/1.1 client
(`bench.raw_http`; `--client httpx` uses httpx, which costs the client about 1 ms of CPU per
request, as much as the server, and so crowds a 2-core machine):

- `health`: `GET /health`, the floor: HTTP on both sides plus the client's own cost;
- `chat`: a non-streaming chat completion;
- `chat_stream`: the same, streamed, with usage in the last chunk.

With an engine that costs nothing, a chat request's whole client-measured latency is overhead.
For streams, the time to the first body chunk is reported too (the TTFT the gateway adds).
The report gives it raw and minus the floor (percentile by percentile: an estimate, since the
difference of two percentiles is not the percentile of the differences), the time the request
spent inside the ASGI app as the server measured it, the server's CPU time per request, and how
late the client sent (if it lags, the machine is saturated and the figures say so).

`--auth none` serves everyone as the default tenant; `--auth keys` adds a tenant API key
checked against SQLite (cached), and usage records written by the batched writer.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx

from bench.metadata import git_commit, machine_info, now_utc, redacted_command
from bench.overhead_server import MODEL_NAME, TIMINGS_PATH
from bench.raw_http import HTTPProtocolError, RawClient, build_request
from bench.stats import LatencySummary

_REPO_ROOT = Path(__file__).resolve().parent.parent
_START_TIMEOUT_S = 120.0
_LITELLM_PUBLISHED = "LiteLLM publishes 2 ms p50 / 13 ms p99 added latency at ~1,170 RPS over 4 instances"
_TARGET = "issue 3 target: p50 <= 2 ms at 200 requests/s on the 2-core machine; p99 below 13 ms"
_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write one short sentence about rivers."},
]


class AuthSetup(enum.Enum):
    """How the benchmarked server identifies callers."""

    NONE = "none"
    KEYS = "keys"


class LoadClient(enum.Enum):
    """What sends the load: the lean raw HTTP/1.1 client, or httpx (about 1 ms of CPU per request)."""

    RAW = "raw"
    HTTPX = "httpx"


class Scenario(enum.Enum):
    """One kind of request, sent for a whole phase."""

    HEALTH = "health"
    CHAT = "chat"
    CHAT_STREAM = "chat_stream"

    @property
    def path(self) -> str:
        return "/health" if self is Scenario.HEALTH else "/v1/chat/completions"

    @property
    def stream(self) -> bool:
        return self is Scenario.CHAT_STREAM

    def body(self, max_tokens: int) -> bytes | None:
        """The request body (None for GET)."""
        if self is Scenario.HEALTH:
            return None
        body: dict[str, Any] = {"model": MODEL_NAME, "messages": _MESSAGES, "max_tokens": max_tokens}
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return json.dumps(body).encode()


@dataclass(frozen=True)
class OverheadConfig:
    """One benchmark run; validated on construction."""

    model: Path  # a folder with the tokenizer (and chat template) to serve
    out_dir: Path
    rate: float = 200.0  # requests/s, evenly spaced
    num_requests: int = 3000  # per scenario
    max_duration_s: float = 30.0  # per scenario: nothing is sent after this
    num_warmup: int = 200  # per scenario, at the same rate, not recorded
    output_tokens: int = 16  # tokens per answer (SSE content chunks per stream)
    auth: tuple[AuthSetup, ...] = (AuthSetup.NONE, AuthSetup.KEYS)
    scenarios: tuple[Scenario, ...] = (Scenario.HEALTH, Scenario.CHAT, Scenario.CHAT_STREAM)
    timeout_s: float = 10.0  # per request
    client: LoadClient = LoadClient.RAW
    admission: bool = True  # the server's admission control, on by default as in `weir serve`
    command: str = ""

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.num_warmup < 0:
            raise ValueError(f"num_warmup must be >= 0, got {self.num_warmup}")
        if not self.max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0, got {self.max_duration_s}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not self.auth:
            raise ValueError("auth must name at least one mode")
        if not self.scenarios:
            raise ValueError("scenarios must name at least one scenario")


@dataclass
class PhaseResult:
    """What one scenario measured on one server."""

    scenario: Scenario
    latencies_ms: list[float] = field(default_factory=list)  # client: send -> whole body read
    first_chunk_ms: list[float] = field(default_factory=list)  # streams: send -> first body chunk
    lags_ms: list[float] = field(default_factory=list)  # client: actual send - due time
    in_app_ms: list[float] = field(default_factory=list)  # server: ASGI call -> last body message
    errors: Counter[str] = field(default_factory=Counter)
    num_sent: int = 0
    duration_s: float = 0.0
    server_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def to_json(self) -> dict[str, Any]:
        num_ok = len(self.latencies_ms)
        return {
            "sent": self.num_sent,
            "ok": num_ok,
            "errors": dict(self.errors),
            "achieved_rate": round(self.num_sent / self.duration_s, 1) if self.duration_s else None,
            "latency_ms": LatencySummary.of(self.latencies_ms).to_json(),
            "first_chunk_ms": LatencySummary.of(self.first_chunk_ms).to_json()
            if self.scenario.stream
            else None,
            "in_app_ms": LatencySummary.of(self.in_app_ms).to_json(),
            "send_lag_ms": LatencySummary.of(self.lags_ms).to_json(),
            "server_cpu_ms_per_request": _per_request(self.server_cpu_s, self.num_sent),
            "client_cpu_ms_per_request": _per_request(self.client_cpu_s, self.num_sent),
            "load_average_1m": round(self.load_average[0], 2),
        }


def _per_request(cpu_s: float | None, num: int) -> float | None:
    return None if cpu_s is None or num == 0 else round(cpu_s * 1000.0 / num, 3)


# -- the server process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerHandle:
    """A running benchmark server."""

    root: str
    pid: int
    auth_header: dict[str, str]


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def benchmark_server(config: OverheadConfig, auth: AuthSetup, data_dir: Path) -> Iterator[ServerHandle]:
    """Start `bench.overhead_server`, wait until ready, set up a key in keys mode; SIGTERM on exit."""
    log_path = config.out_dir / f"server-{auth.value}.log"
    cmd = [
        sys.executable,
        "-m",
        "bench.overhead_server",
        "--model",
        str(config.model.resolve()),
        "--data-dir",
        str(data_dir.resolve()),
        "--auth",
        auth.value,
        "--output-tokens",
        str(config.output_tokens),
        "--admission",
        "on" if config.admission else "off",
    ]
    with log_path.open("w") as log:
        # cwd: `-m bench...` must import this checkout's packages.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=_REPO_ROOT)
    try:
        assert proc.stdout is not None  # PIPE was asked for
        line = proc.stdout.readline()  # the server prints it once listening, or dies
        if not line:
            raise RuntimeError(f"the benchmark server exited ({proc.wait()}); see {log_path}")
        hello = json.loads(line)
        root = f"http://127.0.0.1:{hello['port']}"
        _wait_ready(root, proc)
        header = _tenant_key_header(root, hello["admin_token"]) if auth is AuthSetup.KEYS else {}
        yield ServerHandle(root=root, pid=proc.pid, auth_header=header)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(root: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{root}/ready", trust_env=False, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the benchmark server did not become ready")
        time.sleep(0.05)


def _tenant_key_header(root: str, admin_token: str) -> dict[str, str]:
    """Create tenant `bench` and a key through the admin API; the Authorization header to use."""
    admin = {"authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=root, headers=admin, trust_env=False, timeout=30.0) as client:
        client.post("/admin/v1/tenants", json={"name": "bench"}).raise_for_status()
        issued = client.post("/admin/v1/tenants/bench/keys", json={})
        issued.raise_for_status()
    return {"authorization": f"Bearer {issued.json()['key']}"}


# -- the load ------------------------------------------------------------------------------------


# One request: (None when it succeeded, else the error kind; perf_counter of the first body byte).
Send = Callable[[], Awaitable[tuple[str | None, float | None]]]


def _ok(scenario: Scenario, status_code: int, body: bytes) -> str | None:
    if status_code != 200:
        return str(status_code)
    if scenario.stream and not body.rstrip().endswith(b"data: [DONE]"):
        return "bad_stream"
    return None


def _httpx_sender(
    client: httpx.AsyncClient, scenario: Scenario, url: str, body: bytes | None, headers: dict[str, str]
) -> Send:
    method = "GET" if body is None else "POST"

    async def send() -> tuple[str | None, float | None]:
        first_s: float | None = None
        try:
            if scenario.stream:
                parts = []
                async with client.stream(method, url, content=body, headers=headers) as resp:
                    async for part in resp.aiter_bytes():
                        if first_s is None:
                            first_s = time.perf_counter()
                        parts.append(part)
                data = b"".join(parts)
            else:
                resp = await client.request(method, url, content=body, headers=headers)
                data = resp.content
        except httpx.TimeoutException:
            return "timeout", None
        except httpx.HTTPError:
            return "connection_error", None
        return _ok(scenario, resp.status_code, data), first_s

    return send


def _raw_sender(client: RawClient, scenario: Scenario, raw_request: bytes, timeout_s: float) -> Send:
    async def send() -> tuple[str | None, float | None]:
        try:
            resp = await asyncio.wait_for(client.request(raw_request), timeout_s)
        except TimeoutError:
            return "timeout", None
        except (OSError, HTTPProtocolError):
            return "connection_error", None
        return _ok(scenario, resp.status_code, resp.body), resp.first_body_s

    return send


async def _one(send: Send, due: float, result: PhaseResult | None) -> None:
    start = time.perf_counter()
    error, first_s = await send()
    end = time.perf_counter()
    if result is None:
        return
    result.lags_ms.append((start - due) * 1000.0)
    if error is None:
        result.latencies_ms.append((end - start) * 1000.0)
        if result.scenario.stream and first_s is not None:
            result.first_chunk_ms.append((first_s - start) * 1000.0)
    else:
        result.errors[error] += 1


@dataclass
class _Clients:
    """The load's client (raw or httpx) and an httpx client for the timings route."""

    http: httpx.AsyncClient
    raw: RawClient | None

    def sender(self, server: ServerHandle, scenario: Scenario, config: OverheadConfig) -> Send:
        body = scenario.body(config.output_tokens)
        headers = dict(server.auth_header)
        if body is not None:
            headers["content-type"] = "application/json"
        if self.raw is None:
            return _httpx_sender(self.http, scenario, server.root + scenario.path, body, headers)
        method = "GET" if body is None else "POST"
        host = f"{self.raw.host}:{self.raw.port}"
        raw_request = build_request(method, host, scenario.path, headers, body)
        return _raw_sender(self.raw, scenario, raw_request, config.timeout_s)


async def _drive(send: Send, config: OverheadConfig, num_requests: int, result: PhaseResult | None) -> int:
    """Send `num_requests` at `config.rate`, evenly spaced, without waiting for answers."""
    interval = 1.0 / config.rate
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    num_sent = 0
    for i in range(num_requests):
        due = t0 + i * interval
        if due - t0 > config.max_duration_s:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_one(send, due, result))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        num_sent += 1
    if tasks:
        await asyncio.wait(set(tasks), timeout=config.timeout_s + 1.0)
    return num_sent


async def _fetch_in_app(
    client: httpx.AsyncClient, server: ServerHandle, reset: bool
) -> dict[str, list[float]]:
    resp = await client.get(server.root + TIMINGS_PATH, params={"reset": "1"} if reset else None)
    resp.raise_for_status()
    timings: dict[str, list[float]] = resp.json()
    return timings


async def run_phase(
    clients: _Clients, server: ServerHandle, scenario: Scenario, config: OverheadConfig
) -> PhaseResult:
    """Warm up, then measure one scenario."""
    send = clients.sender(server, scenario, config)
    await _drive(send, config, config.num_warmup, None)
    await _fetch_in_app(clients.http, server, reset=True)
    result = PhaseResult(scenario=scenario)
    # Client garbage collection would show up as server latency: collect now, not mid-phase.
    gc.collect()
    gc.freeze()
    cpu0, client0, t0 = _process_cpu_s(server.pid), time.process_time(), time.perf_counter()
    try:
        result.num_sent = await _drive(send, config, config.num_requests, result)
    finally:
        gc.unfreeze()
    result.duration_s = time.perf_counter() - t0
    cpu1 = _process_cpu_s(server.pid)
    result.client_cpu_s = time.process_time() - client0
    result.server_cpu_s = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    result.load_average = os.getloadavg()
    result.in_app_ms = (await _fetch_in_app(clients.http, server, reset=True)).get(scenario.path, [])
    return result


async def _run_server_phases(server: ServerHandle, config: OverheadConfig) -> list[PhaseResult]:
    # No connection cap: requests must never queue in the client's pool (open loop).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(config.timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http:
        raw = None
        if config.client is LoadClient.RAW:
            url = httpx.URL(server.root)
            raw = RawClient(url.host, url.port or 80)
        clients = _Clients(http, raw)
        try:
            return [await run_phase(clients, server, s, config) for s in config.scenarios]
        finally:
            if raw is not None:
                await raw.aclose()


# -- the report ----------------------------------------------------------------------------------


def _minus(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if a[k] is None or b.get(k) is None else round(a[k] - b[k], 3) for k in a}  # type: ignore[operator]


def build_report(
    config: OverheadConfig, results: dict[AuthSetup, list[PhaseResult]], meta: dict[str, Any]
) -> dict[str, Any]:
    """The report's JSON: config, metadata, per auth mode and scenario, and the overhead figures."""
    servers: dict[str, dict[str, Any]] = {}
    overhead: dict[str, dict[str, Any]] = {}
    for auth, phases in results.items():
        by_name = {p.scenario.value: p.to_json() for p in phases}
        servers[auth.value] = by_name
        floor = by_name.get(Scenario.HEALTH.value)
        overhead[auth.value] = {}
        for name, phase in by_name.items():
            if name == Scenario.HEALTH.value:
                continue
            figures = {
                "raw_ms": phase["latency_ms"],
                "minus_floor_ms": _minus(phase["latency_ms"], floor["latency_ms"]) if floor else None,
                "in_app_ms": phase["in_app_ms"],
            }
            if phase["first_chunk_ms"] is not None:
                # What a streaming client feels first: the TTFT the gateway adds.
                figures["first_chunk_ms"] = phase["first_chunk_ms"]
                figures["first_chunk_minus_floor_ms"] = (
                    _minus(phase["first_chunk_ms"], floor["latency_ms"]) if floor else None
                )
            overhead[auth.value][name] = figures
    return {
        "config": {
            "model": str(config.model),
            "rate": config.rate,
            "requests_per_scenario": config.num_requests,
            "max_duration_s": config.max_duration_s,
            "warmup_per_scenario": config.num_warmup,
            "output_tokens": config.output_tokens,
            "auth": [a.value for a in config.auth],
            "scenarios": [s.value for s in config.scenarios],
            "timeout_s": config.timeout_s,
            "client": config.client.value,
            "admission": config.admission,
        },
        "metadata": meta,
        "servers": servers,
        "overhead": overhead,
        "reference": {"target": _TARGET, "litellm": _LITELLM_PUBLISHED + " (not measured here)"},
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    meta, cfg = report["metadata"], report["config"]
    machine = meta["machine"]
    lines = [
        "# Gateway overhead (null engine)",
        "",
        f"- date: {meta['date']}; commit: `{meta['commit']}`",
        f"- command: `{meta['command']}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB; "
        f"load average before: {meta['load_average_before']}",
        f"- server: uvicorn loop `{meta['uvicorn_loop']}`, http `{meta['uvicorn_http']}`, "
        f"python {machine['python']}",
        f"- {cfg['rate']} requests/s, evenly spaced, open loop; {cfg['requests_per_scenario']} per scenario "
        f"(at most {cfg['max_duration_s']} s) after {cfg['warmup_per_scenario']} warm-up; "
        f"{cfg['output_tokens']} tokens per answer; tokenizer of `{cfg['model']}`; "
        f"load client `{cfg['client']}`; admission {'on' if cfg['admission'] else 'off'}",
        "",
        "Latency is client-measured (send to whole body read) against a zero-cost engine, so all of it",
        "is overhead. The floor is `GET /health` at the same rate. In-app: the time inside the ASGI app",
        "(server clock). Server CPU: the server process's CPU time per request.",
        "",
        "| auth | request | ok/sent | p50 | p90 | p99 | mean | p50 − floor | p99 − floor "
        "| in-app p50 | in-app p99 | server CPU/req | send lag p99 | load 1m |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for auth, phases in report["servers"].items():
        floor = phases.get(Scenario.HEALTH.value)
        for name, p in phases.items():
            lat, app = p["latency_ms"], p["in_app_ms"]
            minus = _minus(lat, floor["latency_ms"]) if floor and name != Scenario.HEALTH.value else None
            lines.append(
                f"| {auth} | {name} | {p['ok']}/{p['sent']} | {_ms(lat['p50'])} | {_ms(lat['p90'])} "
                f"| {_ms(lat['p99'])} | {_ms(lat['mean'])} | {_ms(minus['p50']) if minus else '-'} "
                f"| {_ms(minus['p99']) if minus else '-'} | {_ms(app['p50'])} | {_ms(app['p99'])} "
                f"| {_ms(p['server_cpu_ms_per_request'])} | {_ms(p['send_lag_ms']['p99'])} "
                f"| {p['load_average_1m']} |"
            )
    lines += [
        "",
        "Streams, time to the first body chunk (role and first token; what the gateway adds to TTFT):",
        "",
        "| auth | p50 | p90 | p99 | p50 − floor | p99 − floor |",
        "|---|---|---|---|---|---|",
    ]
    for auth, scenarios in report["overhead"].items():
        for figures in scenarios.values():
            if "first_chunk_ms" not in figures:
                continue
            first, minus = figures["first_chunk_ms"], figures["first_chunk_minus_floor_ms"] or {}
            lines.append(
                f"| {auth} | {_ms(first['p50'])} | {_ms(first['p90'])} | {_ms(first['p99'])} "
                f"| {_ms(minus.get('p50'))} | {_ms(minus.get('p99'))} |"
            )
    lines += [
        "",
        "All times in ms.",
        "",
        f"- {report['reference']['target']}",
        f"- {report['reference']['litellm']}",
    ]
    return "\n".join(lines) + "\n"


def _uvicorn_impl() -> tuple[str, str]:
    # uvicorn's "auto" picks uvloop and httptools when installed, else asyncio and h11.
    loop = "uvloop" if find_spec("uvloop") is not None else "asyncio"
    http = "httptools" if find_spec("httptools") is not None else "h11"
    return loop, http


def run_overhead(config: OverheadConfig) -> dict[str, Any]:
    """Run every auth mode and scenario; write report.json and report.md; return the report."""
    if not config.model.is_dir():
        raise ValueError(f"model: {config.model} is not a folder (a model folder with a tokenizer)")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    loop, http = _uvicorn_impl()
    meta: dict[str, Any] = {
        "date": now_utc(),
        "command": config.command,
        "commit": git_commit(),
        "machine": machine_info(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "uvicorn_loop": loop,
        "uvicorn_http": http,
    }
    results: dict[AuthSetup, list[PhaseResult]] = {}
    for auth in config.auth:
        with tempfile.TemporaryDirectory(prefix="weir-overhead-") as data_dir:
            with benchmark_server(config, auth, Path(data_dir)) as server:
                results[auth] = asyncio.run(_run_server_phases(server, config))
    meta["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report = build_report(config, results, meta)
    (config.out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (config.out_dir / "report.md").write_text(format_markdown(report))
    return report


# -- command line ----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `bench overhead`."""
    p.add_argument(
        "--model", type=Path, help="model folder whose tokenizer is served (default: the default model)"
    )
    p.add_argument("--cache-dir", dest="cache_dir", help="where the default model is prepared")
    p.add_argument("--out", type=Path, default=Path("bench-out/overhead"), help="output directory")
    p.add_argument("--rate", type=float, default=200.0, help="requests/s (default 200)")
    p.add_argument("--requests", type=int, default=3000, help="measured requests per scenario (default 3000)")
    p.add_argument("--max-duration-s", type=float, default=30.0, help="per scenario (default 30)")
    p.add_argument("--warmup", type=int, default=200, help="warm-up requests per scenario (default 200)")
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per answer (default 16)")
    p.add_argument("--auth", choices=["none", "keys", "both"], default="both", help="default both")
    p.add_argument("--timeout-s", type=float, default=10.0, help="per request (default 10)")
    p.add_argument(
        "--client",
        choices=[c.value for c in LoadClient],
        default=LoadClient.RAW.value,
        help="load client: raw (a lean HTTP/1.1 client, default) or httpx",
    )
    p.add_argument(
        "--admission", choices=["on", "off"], default="on", help="the server's admission control (default on)"
    )
    p.set_defaults(func=overhead_command)


def _default_model(cache_dir: str | None) -> Path:
    from engine.model_prepare import ensure_default_model
    from gateway.settings import Settings

    return ensure_default_model(Settings.from_environment({"cache_dir": cache_dir}).cache_dir)


def overhead_command(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run `bench overhead` and print the main figures; 2 on bad flags or a server that won't start."""
    auth = (AuthSetup.NONE, AuthSetup.KEYS) if args.auth == "both" else (AuthSetup(args.auth),)
    try:
        model = args.model if args.model is not None else _default_model(args.cache_dir)
        config = OverheadConfig(
            model=model,
            out_dir=args.out,
            rate=args.rate,
            num_requests=args.requests,
            max_duration_s=args.max_duration_s,
            num_warmup=args.warmup,
            output_tokens=args.output_tokens,
            auth=auth,
            timeout_s=args.timeout_s,
            client=LoadClient(args.client),
            admission=args.admission == "on",
            command=redacted_command(argv if argv is not None else getattr(args, "argv", None)),
        )
        report = run_overhead(config)
    except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
        print(f"bench overhead: {exc}", file=sys.stderr)
        return 2
    for mode, scenarios in report["overhead"].items():
        for name, o in scenarios.items():
            raw, minus = o["raw_ms"], o["minus_floor_ms"] or {}
            print(
                f"auth {mode:4} {name:11}: p50 {_ms(raw['p50'])} ms, p99 {_ms(raw['p99'])} ms "
                f"(minus floor: p50 {_ms(minus.get('p50'))}, p99 {_ms(minus.get('p99'))})"
            )
    print(f"report in {config.out_dir}")
    return 0
