"""Issue 10 through the real HTTP server: one tenant's bad request, or an engine fault, never
fails another tenant's request.

uvicorn on 127.0.0.1 with tenancy (SQLite, keys) as `weir serve` wires it, over the real engine on
a tiny random Llama with a 512-token KV pool (32 blocks of 16), like the reproduction's
`--kv-cache-tokens 512`. Faults are injected through the test-only `FaultInjector`, which no
setting or HTTP field reaches. Bounded: every wait polls a fixed number of times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread
from weir.engine.async_engine import AsyncEngine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.faults import FaultInjector
from weir.gateway.http.errors import AuthenticationError
from weir.gateway.server.app import create_app
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

MODEL = "tiny-llama"
ADMIN = {"authorization": "Bearer admin-secret"}
PROMPT = [{"role": "user", "content": "Hello, world! How are you today?"}]


class Faults(FaultInjector):
    """Arm one fault at a time from the test thread; hooks run on the engine thread."""

    def __init__(self) -> None:
        self.forwards_to_skip = 0  # forwards that run before the armed failures
        self.forward_failures = 0  # then this many forwards raise
        self.schedule_fault = False  # the next schedule raises (once)
        self.restart_gate = threading.Event()  # a restart waits for it (to observe /ready)
        self.restart_gate.set()
        self.restarting = threading.Event()

    def before_forward(self, step: int) -> None:
        if self.forwards_to_skip > 0:
            self.forwards_to_skip -= 1
        elif self.forward_failures > 0:
            self.forward_failures -= 1
            raise RuntimeError("injected forward fault")

    def before_schedule(self) -> None:
        if self.schedule_fault:
            self.schedule_fault = False
            raise RuntimeError("injected scheduler fault")

    def on_restart(self) -> None:
        self.restarting.set()
        self.restart_gate.wait(30)


async def _check_admin(authorization: str | None, client_addr: str) -> None:
    if authorization != ADMIN["authorization"]:
        raise AuthenticationError("admin token required")


@dataclass
class Server:
    url: str
    engine: AsyncEngine
    faults: Faults
    keys: dict[str, str]

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.keys[tenant], max_retries=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = make_tiny_model(
        tmp_path_factory.mktemp("fault-e2e"), arch="llama", num_kv_heads=2, max_position_embeddings=8192
    )
    faults = Faults()
    core = build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(num_blocks=33, block_size=16),  # 512 tokens of KV cache
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=8192),
        ),
        faults=faults,
    )
    engine = AsyncEngine(core=core)
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("fault-db"), admin_token="admin-secret", auth=AuthMode.KEYS
    )
    tenancy = build_tenancy(settings)
    app = create_app(
        settings,
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=MODEL,
        vocab_size=engine.model_config.vocab_size,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        extra_routes=tenancy.routes,
        metrics_auth=_check_admin,
        on_startup=[*([tenancy.start] if tenancy.start else []), engine.start],
        on_shutdown=[engine.shutdown, *([tenancy.close] if tenancy.close else [])],
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN, timeout=30) as admin:
        keys = {}
        for tenant in ("careless", "steady"):
            assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
            keys[tenant] = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"]
        yield Server(url, engine, faults, keys)


def _stream_text(
    client: openai.OpenAI, max_tokens: int = 24, started: threading.Event | None = None
) -> tuple[str, str | None]:
    """Stream a chat answer to the end; returns its text and finish reason."""
    parts: list[str] = []
    reason = None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=PROMPT,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        if started is not None:
            started.set()
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reason = choice.finish_reason or reason
    return "".join(parts), reason


def _reference(server: Server) -> str:
    with server.client("steady") as steady:
        r = steady.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    return r.choices[0].message.content or ""


def _while_streaming(server: Server, action) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    """Run `action` while the steady tenant's stream is running; returns that stream's text and
    finish reason."""
    started = threading.Event()
    with server.client("steady") as steady, ThreadPoolExecutor(1) as pool:
        stream: Future[tuple[str, str | None]] = pool.submit(_stream_text, steady, 200, started)
        assert started.wait(60)
        action()
        return stream.result(timeout=120)


@pytest.mark.parametrize("seed", [2**64, -(2**64)])
def test_an_out_of_range_seed_is_a_400_and_does_not_touch_another_tenant(server: Server, seed: int) -> None:
    def bad() -> None:
        with server.client("careless") as careless:
            with pytest.raises(openai.BadRequestError) as info:
                careless.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, seed=seed)  # type: ignore[arg-type]
            assert info.value.status_code == 400
            assert isinstance(info.value.body, dict) and info.value.body.get("param") == "seed"

    text, reason = _while_streaming(server, bad)
    assert reason == "length" and text


def test_n2_with_the_largest_seed_is_served(server: Server) -> None:
    """Its second choice's seed (2**64) overflowed inside the engine step and failed every request."""
    results: list[object] = []

    def edge() -> None:
        with server.client("careless") as careless:
            results.append(
                careless.chat.completions.create(
                    model=MODEL,
                    messages=PROMPT,
                    max_tokens=8,
                    n=2,
                    seed=2**64 - 1,
                    temperature=1.0,  # type: ignore[arg-type]
                )
            )

    text, reason = _while_streaming(server, edge)
    assert reason == "length" and text
    (r,) = results
    assert [c.finish_reason for c in r.choices] == ["length", "length"]  # type: ignore[attr-defined]


def test_a_request_that_can_never_fit_the_pool_is_a_400_with_the_numbers(server: Server) -> None:
    """Defect 2: a 480-token prompt with max_tokens 200 over 512 tokens of KV cache stalled everyone."""
    assert server.engine.max_model_len == 512  # the pool caps the context at start-up
    with server.client("careless") as careless:
        with pytest.raises(openai.BadRequestError) as info:
            careless.completions.create(model=MODEL, prompt=[5] * 480, max_tokens=200)
    message = str(info.value)
    assert "512" in message and "680" in message
    text, reason = _stream_text(server.client("steady"), max_tokens=2)
    assert reason == "length" and text
    stats = server.engine.stats()
    assert (stats.num_running, stats.num_waiting) == (0, 0)


def test_a_forward_fault_fails_the_streaming_request_with_a_503_and_the_engine_keeps_serving(
    server: Server,
) -> None:
    expected = _reference(server)
    # Alone on the engine: forward 1 computes the prompt and samples the first token, 2 the next,
    # and 3 fails: the request has streamed by then.
    server.faults.forwards_to_skip, server.faults.forward_failures = 2, 1
    with server.client("steady") as steady:
        stream = steady.chat.completions.create(
            model=MODEL,
            messages=PROMPT,
            max_tokens=200,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        chunks = iter(stream)
        assert next(chunks).choices
        with pytest.raises(openai.APIError) as info:
            for _ in chunks:
                pass
        assert "engine_retryable" in str(info.value.body) or "retry" in str(info.value)
    # A request that had not streamed anything when the forward failed is retried, and succeeds.
    server.faults.forward_failures = 1
    assert _reference(server) == expected
    assert server.faults.forward_failures == 0


def test_a_request_whose_retry_fails_too_gets_a_retryable_503(server: Server) -> None:
    server.faults.forward_failures = 2  # the first forward and its retry
    with server.client("careless") as careless:
        with pytest.raises(openai.InternalServerError) as info:
            careless.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert info.value.status_code == 503
    assert isinstance(info.value.body, dict) and info.value.body.get("code") == "engine_retryable"
    assert server.faults.forward_failures == 0
    assert _reference(server)  # and the engine keeps serving


def test_a_scheduler_fault_restarts_the_engine_ready_false_then_true(server: Server) -> None:
    faults = server.faults
    faults.restart_gate.clear()
    faults.restarting.clear()
    restarts = server.engine.stats().num_restarts
    with httpx.Client(base_url=server.url, timeout=30) as http, ThreadPoolExecutor(1) as pool:
        assert http.get("/ready").status_code == 200
        faults.schedule_fault = True
        with server.client("careless") as careless:
            victim = pool.submit(
                careless.chat.completions.create, model=MODEL, messages=PROMPT, max_tokens=8, temperature=0
            )
            assert faults.restarting.wait(60)
            assert http.get("/ready").status_code == 503  # the loop is restarting
            faults.restart_gate.set()
            with pytest.raises(openai.InternalServerError) as info:
                victim.result(timeout=60)
        assert info.value.status_code == 503
        for _ in range(200):
            if http.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        assert http.get("/ready").status_code == 200
        metrics = http.get("/metrics", headers=ADMIN)
        assert metrics.status_code == 200
        assert f"weir_engine_restarts_total {float(restarts + 1)}" in metrics.text
    assert server.engine.stats().num_restarts == restarts + 1
    text, reason = _stream_text(server.client("steady"), max_tokens=4)
    assert reason == "length" and text
