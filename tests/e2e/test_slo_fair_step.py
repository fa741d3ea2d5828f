"""Issue 24 end to end: two tenants of one class, one of them sending n = 16, beam 16 and long
prompts; the other's request is served within the first steps instead of behind them.

A real engine (a tiny random Llama; fixed 16-token steps so that long prompts take many steps)
with the fair queue, tenancy with two API keys, uvicorn on 127.0.0.1 and the official openai
client. The attacker's three requests are running (their prompts being computed) when the
victim's short chat arrives. The step's prefill budget is shared between the tenants by weight,
and the waiting victim counts as one of them, so it is admitted and answered while the
attacker's prompts are still being computed: its whole answer arrives before the attacker's
first token. Before issue 24 the running prompts took every step's budget and the victim waited
for all of them. Nothing here measures time: the check is the order of events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread
from weir.engine.async_engine import AsyncEngine
from weir.engine.config import CacheConfig, EngineConfig, QueuePolicy, SchedulerConfig
from weir.gateway.server.app import create_app
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

MODEL = "tiny-llama"
ADMIN_TOKEN = "admin-secret-for-slo-tests"
LONG = [5 + (i % 50) for i in range(900)]  # 900 tokens: 57 steps of 16 on its own


@contextlib.contextmanager
def _serve(tmp: Path) -> Iterator[tuple[str, AsyncEngine, dict[str, str]]]:
    path = make_tiny_model(tmp / "model", arch="llama", num_kv_heads=2, max_position_embeddings=2048)
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(num_blocks=1200, block_size=16),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=16, max_num_seqs=64, max_model_len=1024, queue_policy=QueuePolicy.FAIR
        ),
    )
    engine = AsyncEngine(config)
    settings = Settings(data_dir=tmp / "data", admin_token=ADMIN_TOKEN, auth=AuthMode.KEYS)
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
        on_startup=[engine.start, *([tenancy.start] if tenancy.start else [])],
        on_shutdown=[engine.shutdown, *([tenancy.close] if tenancy.close else [])],
    )
    admin_headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=admin_headers, timeout=30) as admin:
        keys = {}
        for name in ("attacker", "victim"):
            created = admin.post("/admin/v1/tenants", json={"name": name, "priority": "standard"})
            assert created.status_code == 201, created.text
            keys[name] = admin.post(f"/admin/v1/tenants/{name}/keys", json={}).json()["key"]
        yield url, engine, keys


async def _scenario(url: str, engine: AsyncEngine, keys: dict[str, str]) -> list[str]:
    events: list[str] = []
    attacker = openai.AsyncOpenAI(base_url=url + "/v1", api_key=keys["attacker"], max_retries=0, timeout=600)
    victim = openai.AsyncOpenAI(base_url=url + "/v1", api_key=keys["victim"], max_retries=0, timeout=600)

    async def stream(client: openai.AsyncOpenAI, name: str, prompt: list[int], **kw: object) -> None:
        first = True
        async for chunk in await client.completions.create(
            model=MODEL,
            prompt=prompt,
            stream=True,
            temperature=1.0,
            seed=1,
            **kw,  # type: ignore[call-overload]
        ):
            if first and chunk.choices and (chunk.choices[0].text or chunk.choices[0].finish_reason):
                events.append(f"{name}:first")
                first = False
        events.append(f"{name}:done")

    async def beam() -> None:
        await attacker.completions.create(
            model=MODEL,
            prompt=LONG,
            max_tokens=4,
            n=1,
            extra_body={"use_beam_search": True, "beam_width": 16},
        )
        events.append("beam:done")

    try:
        tasks = [
            asyncio.create_task(stream(attacker, "n16", LONG, max_tokens=4, n=16)),
            asyncio.create_task(stream(attacker, "long", LONG[::-1], max_tokens=4)),
            asyncio.create_task(beam()),
        ]
        # the attacker's three requests are in the engine, their prompts being computed
        for _ in range(6000):
            stats = engine.stats()
            if stats.num_running + stats.num_waiting >= 3:
                break
            await asyncio.sleep(0.002)
        else:
            pytest.fail("the attacker's requests never reached the engine")
        assert not events, events  # no attacker token yet
        events.append("victim:sent")
        await stream(
            victim, "victim", [7, 8, 9, 10, 11, 12, 13, 14], max_tokens=4, extra_body={"ignore_eos": True}
        )
        await asyncio.gather(*tasks)
    finally:
        await attacker.close()
        await victim.close()
    return events


def test_the_victims_answer_comes_before_the_attackers_first_token(tmp_path: Path) -> None:
    with _serve(tmp_path) as (url, engine, keys):
        events = asyncio.run(_scenario(url, engine, keys))
        assert events.index("victim:sent") < events.index("victim:done")
        attacker_firsts = [events.index(e) for e in ("n16:first", "long:first") if e in events]
        assert attacker_firsts and events.index("victim:done") < min(attacker_firsts), events
        assert events.index("victim:done") < events.index("beam:done"), events
        # the engine judged no preemption necessary for it: the share, not a displacement
        stats = engine.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
