"""`weir bench overhead`: what the gateway adds to each request, against a zero-cost engine.

The real gateway (`weir_bench.overhead_server`: create_app, the model's tokenizer and chat template,
the SQLite tenancy, uvicorn) runs over `NullEngine` in a subprocess on 127.0.0.1. This process
drives it open-loop at a fixed rate, one scenario at a time, with a lean HTTP/1.1 client
(`weir_bench.raw_http`; `--client httpx` uses httpx, which costs the client about 1 ms of CPU per
request, as much as the server, and so crowds a 2-core machine):

- `health`: `GET /health`, the floor: HTTP on both sides plus the client's own cost;
- `chat`: a non-streaming chat completion;
- `chat_stream`: the same, streamed, with usage in the last chunk;
- `responses`, `responses_stream`: the same prompt through `POST /v1/responses` (stored, the
  default, so a stored answer's write is counted), whole and streamed; not run by default
  (`--scenarios`).

With an engine that costs nothing, a chat request's whole client-measured latency is overhead.
For streams, the time to the first body chunk is reported too (the TTFT the gateway adds).
The report gives it raw and minus the floor (percentile by percentile: an estimate, since the
difference of two percentiles is not the percentile of the differences), the time the request
spent inside the ASGI app as the server measured it, the server's CPU time per request, and how
late the client sent (if it lags, the machine is saturated and the figures say so).

`--auth none` serves everyone as the default tenant; `--auth keys` adds a tenant API key
checked against SQLite (cached), and usage records written by the batched writer.

This module is the server and the load; `weir_bench.overhead_command` runs them and writes the report.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir.gateway.settings.settings import Settings
from weir_bench.overhead_server import MODEL_NAME, TIMINGS_PATH
from weir_bench.raw_http import HTTPProtocolError, RawClient, build_request
from weir_bench.stats import LatencySummary

_REPO_ROOT = Path(__file__).resolve().parent.parent
_START_TIMEOUT_S = 120.0
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
    RESPONSES = "responses"
    RESPONSES_STREAM = "responses_stream"

    @property
    def path(self) -> str:
        if self is Scenario.HEALTH:
            return "/health"
        return "/v1/responses" if self.responses_api else "/v1/chat/completions"

    @property
    def responses_api(self) -> bool:
        return self in (Scenario.RESPONSES, Scenario.RESPONSES_STREAM)

    @property
    def stream(self) -> bool:
        return self in (Scenario.CHAT_STREAM, Scenario.RESPONSES_STREAM)

    @property
    def stream_end(self) -> bytes:
        """The last bytes of a complete stream."""
        return b"}" if self.responses_api else b"data: [DONE]"

    def body(self, max_tokens: int) -> bytes | None:
        """The request body (None for GET)."""
        if self is Scenario.HEALTH:
            return None
        body: dict[str, Any] = {"model": MODEL_NAME}
        if self.responses_api:
            body |= {"instructions": _MESSAGES[0]["content"], "input": _MESSAGES[1]["content"]}
            body["max_output_tokens"] = max_tokens
            if self.stream:
                body["stream"] = True
            return json.dumps(body).encode()
        body |= {"messages": _MESSAGES, "max_tokens": max_tokens}
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
    gil_switch_interval_ms: float | None = None  # the server's; None: the settings' default
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
        if self.gil_switch_interval_ms is not None:  # the server's rule, checked before it starts
            Settings(gil_switch_interval_ms=self.gil_switch_interval_ms)
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
    """Start `weir_bench.overhead_server`, wait until ready, set up a key in keys mode; SIGTERM on exit."""
    log_path = config.out_dir / f"server-{auth.value}.log"
    cmd = [
        sys.executable,
        "-m",
        "weir_bench.overhead_server",
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
    if config.gil_switch_interval_ms is not None:
        cmd += ["--gil-switch-interval-ms", str(config.gil_switch_interval_ms)]
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
    if scenario.stream and not body.rstrip().endswith(scenario.stream_end):
        return "bad_stream"
    if scenario.responses_api and scenario.stream:
        tail = body[-8192:]  # the last event holds the whole response (the null engine stops at the bound)
        if b"event: response.completed" not in tail and b"event: response.incomplete" not in tail:
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


async def run_server_phases(server: ServerHandle, config: OverheadConfig) -> list[PhaseResult]:
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
