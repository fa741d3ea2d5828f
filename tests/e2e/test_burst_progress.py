"""Issue 29's reproducer end to end: a burst that overfills the KV pool completes.

The real SmolLM2 behind uvicorn, configured as `weir serve --kv-cache-tokens 4096
--target-step-ms 0` configures it (the fair queue; no running cap, so the burst fills the pool),
with and without a host tier. The first 48 requests of shared/workloads/mixed.jsonl (standard and
batch classes of one tenant) are streamed at once through the official openai client. On the old
scheduler a standard request displaced a batch one, which went back to the head of the tenant's
queue and was admitted again, inside one step, for ever: nothing moved again, for any tenant.
Every request must now finish with its `max_tokens` streamed, and the stall watchdog must never
have had to act.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.real_engine_server import serve_engine
from tests.gateway.harness import ADMIN_HEADERS
from weir.engine.latency_targets import NO_CLASS_TARGETS
from weir.gateway.server.bootstrap import engine_config
from weir.gateway.settings.settings import Settings

pytestmark = pytest.mark.slow

MODEL = "smollm2"
WORKLOAD = Path(__file__).resolve().parents[3] / "shared" / "workloads" / "mixed.jsonl"
NUM_REQUESTS = 48
MAX_TOKENS = 16  # the trace's lengths cut short: the freeze came before the first tokens


def _burst() -> list[dict]:
    if not WORKLOAD.is_file():
        pytest.skip(f"the shared workloads are not at {WORKLOAD}")
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    return rows[:NUM_REQUESTS]


async def _stream_all(url: str, rows: list[dict]) -> list[tuple[str | None, int]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="local", max_retries=0, timeout=900)

    async def one(row: dict) -> tuple[str | None, int]:
        # The default tenant is of the standard class: an interactive request would be refused.
        priority = "batch" if row["priority"] == "batch" else "standard"
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=row["messages"],
            max_tokens=min(MAX_TOKENS, row["max_tokens"]),
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "priority": priority},
        )
        finish, tokens = None, 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return finish, tokens

    try:
        return await asyncio.gather(*(one(row) for row in rows))
    finally:
        await client.close()


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers=ADMIN_HEADERS, timeout=10).text
    return sum(
        s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    )


@pytest.mark.parametrize("host_kv_cache_tokens", [0, 32768], ids=["recompute", "host-tier"])
def test_a_burst_that_overfills_the_pool_completes(
    default_model_dir: Path, host_kv_cache_tokens: int
) -> None:
    rows = _burst()
    settings = Settings(
        kv_cache_tokens=4096, host_kv_cache_tokens=host_kv_cache_tokens, target_step_ms=0, dtype="float32"
    )
    config = engine_config(settings, default_model_dir, "cpu")
    # Without class latency targets, as when the livelock was found: the standard class's ITL
    # target would cap the step and the running set, and the burst would no longer overfill the
    # pool (the preemption path under test).
    scheduler = dataclasses.replace(config.scheduler, class_targets=NO_CLASS_TARGETS)
    config = dataclasses.replace(config, scheduler=scheduler)
    with serve_engine(config, MODEL) as served:
        results = asyncio.run(_stream_all(served.url, rows))
        assert results == [("length", min(MAX_TOKENS, row["max_tokens"])) for row in rows]
        assert _counter(served.url, "weir_engine_stalls_total") == 0
        assert served.engine.core.scheduler.num_preemptions > 0  # the pool was overfilled indeed
