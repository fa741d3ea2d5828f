"""Issue 21 item 4 end to end: a budget bypassed by cancelling before the first token.

A tenant with 1,500 tokens per minute sent 1,000-token prompts and cut each before its first
token: the prefill was computed, the budget was charged 0, and no 429 came. Here a real engine (a
tiny random Llama, prefill in chunks of 100 tokens) serves behind uvicorn on 127.0.0.1; a test
gate holds the engine in the middle of the prefill while the client hangs up (a raw socket), so
the engine has computed exactly 800 prompt tokens when the abort lands. Those 800 are billed (the
usage record and the budget), and the tenant's next 1,000-token request is a 429.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread, wait_until
from weir.engine.async_engine import AsyncEngine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.faults import FaultInjector
from weir.engine.request import Priority
from weir.gateway.admission.accounting import Outcome, UsageRecord
from weir.gateway.admission.controller import AdmissionConfig, AdmissionController
from weir.gateway.server.app import create_app
from weir.gateway.settings.settings import Settings
from weir.tenancy.budgets.quotas import LocalBudget
from weir.tenancy.context import QuotaLimits, TenantContext

MODEL = "tiny-llama"
PROMPT = [5] * 1000
CHUNK = 100
QUOTA = QuotaLimits(tokens_per_minute=1500)
START = 1_900_000_000.0


class PrefillGate(FaultInjector):
    """Once armed, holds the engine thread before its `hold_at`-th model forward until released."""

    def __init__(self) -> None:
        self.hold_at: int | None = None
        self.num_forwards = 0
        self.held = threading.Event()
        self.release = threading.Event()

    def arm(self, hold_at: int) -> None:
        self.num_forwards, self.hold_at = 0, hold_at
        self.held.clear()
        self.release.clear()

    def before_forward(self, step: int) -> None:
        if self.hold_at is None:
            return
        self.num_forwards += 1
        if self.num_forwards == self.hold_at:
            self.hold_at = None
            self.held.set()
            assert self.release.wait(60)


@dataclass
class Served:
    engine: AsyncEngine
    gate: PrefillGate
    url: str
    records: list[UsageRecord] = field(default_factory=list)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path: Path = make_tiny_model(
        tmp_path_factory.mktemp("cancel-billing"), arch="llama", num_kv_heads=2, max_position_embeddings=2048
    )
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(num_blocks=256, block_size=16, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=CHUNK, max_num_seqs=4, max_model_len=2048),
    )
    gate = PrefillGate()
    engine = AsyncEngine(core=build_engine(config, faults=gate))
    clock = [START]  # stopped: the bucket refills only when a test moves it
    controller = AdmissionController(engine.stats, LocalBudget(lambda: clock[0]), AdmissionConfig())
    records: list[UsageRecord] = []

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        return TenantContext("acme", "key-acme", Priority.STANDARD, 1.0, "acme", QUOTA)

    app = create_app(
        Settings(),
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=MODEL,
        vocab_size=engine.model_config.vocab_size,
        authenticate=authenticate,
        admission=controller,
        usage_sink=records.append,
        on_startup=[engine.start],
        on_shutdown=[engine.shutdown],
    )
    with serve_in_thread(app) as url:
        yield Served(engine, gate, url, records)


def _cancel_during_prefill(served: Served, num_chunks: int) -> UsageRecord:
    """Stream a 1,000-token prompt and hang up while the engine holds before chunk `num_chunks`."""
    served.gate.arm(num_chunks)
    host, port = served.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer acme\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    num_records = len(served.records)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        assert served.gate.held.wait(60)  # chunks 1..num_chunks-1 computed, chunk num_chunks about to run
    # The client is gone; once the gateway has sent its abort, the held step may finish.
    assert wait_until(lambda: not served.engine._open, 30)
    served.gate.release.set()
    assert wait_until(lambda: len(served.records) > num_records, 30)
    return served.records[-1]


def test_a_prefill_cancelled_before_its_first_token_is_billed_and_the_budget_then_says_429(
    served: Served,
) -> None:
    record = _cancel_during_prefill(served, 8)
    assert record.outcome is Outcome.CLIENT_DISCONNECTED
    assert record.usage.completion_tokens == 0  # no token came
    stats = served.engine.stats()
    assert wait_until(lambda: served.engine.stats().num_free_blocks == stats.num_total_blocks)
    # 1,500 - 800 left: the next 1,000-token prompt (1,008 reserved) waits for the budget.
    r = httpx.post(
        served.url + "/v1/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 8},
        headers={"authorization": "Bearer acme"},
        timeout=60,
    )
    assert r.status_code == 429, r.text  # before the fix: 200, the cancelled prefill cost nothing
    assert record.usage.billed_prompt_tokens == 8 * CHUNK  # the 8 chunks computed, not 0
    assert record.usage.billed_total_tokens == 800
