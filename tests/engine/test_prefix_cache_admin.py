"""The prefix cache's admin facade (`AsyncEngine.prefix_cache`): calls run on the engine thread, results are typed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.async_engine import AsyncEngine
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import EngineDeadError
from weir.engine.kv.prefix_cache_types import InvalidPrefixError, PinCapacityError, UnknownPrefixError
from weir.engine.request import SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("svc"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


def _async_engine(path: Path, num_blocks: int = 64) -> AsyncEngine:
    core = build_engine(
        EngineConfig(
            model_path=str(path),
            model_version="v7",
            cache=CacheConfig(block_size=4, num_blocks=num_blocks, tenant_cache_share=0.5),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256),
        )
    )
    return AsyncEngine(core=core)


async def _complete(engine: AsyncEngine, rid: str, prompt: tuple[int, ...], tenant: str) -> int:
    params = SamplingParams(max_tokens=2, temperature=0.0)
    cached = -1
    async for out in engine.generate(
        EngineRequest(rid, prompt, params, tenant_id=tenant, cache_scope=tenant)
    ):
        cached = out.num_cached_tokens
    return cached


def test_control_calls_on_a_running_engine(tiny: Path) -> None:
    engine = _async_engine(tiny)
    control = engine.prefix_cache

    async def scenario() -> None:
        await engine.start(warmup=False)
        try:
            system = tuple(range(50, 70))  # 5 blocks
            info = await control.register(system, name="sys", pin=True)
            assert (info.name, info.num_blocks, info.num_cached_blocks, info.pinned) == ("sys", 5, 5, True)
            assert await control.register(system) == info  # idempotent
            assert await _complete(engine, "a", system + (7, 8, 9, 10, 11), "acme") == 20
            assert await _complete(engine, "b", system + (7, 8, 9, 10, 11), "globex") == 20
            assert await _complete(engine, "a2", system + (7, 8, 9, 10, 11), "acme") == 24
            stats = await control.stats()
            assert stats.model_version == "v7" and stats.num_pinned_blocks == 5
            tenants = {t.tenant_id: t for t in stats.tenants}
            assert tenants["acme"].num_hit_tokens == 44 and tenants["globex"].num_hit_tokens == 20
            assert tenants["acme"].num_cached_blocks >= 1 and stats.max_cached_blocks_per_scope == 31
            assert [p.prefix_id for p in await control.list_prefixes()] == [info.prefix_id]
            unpinned = await control.unpin(info.prefix_id)
            assert not unpinned.pinned and (await control.stats()).num_pinned_blocks == 0
            flushed = await control.flush(model_version="v7")
            assert flushed.model_version_matched and flushed.num_blocks_flushed >= 6
            assert (await control.get(info.prefix_id)).num_cached_blocks == 0
            repinned = await control.pin(info.prefix_id)  # recomputed, then held
            assert repinned.pinned and repinned.num_cached_blocks == 5
            assert (await control.flush(model_version="v6")).model_version_matched is False
            with pytest.raises(UnknownPrefixError):
                await control.pin("nope")
            with pytest.raises(InvalidPrefixError):
                await control.register((1, 2))
            with pytest.raises(PinCapacityError):
                await control.register(tuple(range(100, 228)), pin=True)  # 32 blocks > half the pool
            await control.unregister(info.prefix_id)
            assert await control.list_prefixes() == ()
        finally:
            await engine.shutdown()
        with pytest.raises(EngineDeadError):
            await control.stats()

    asyncio.run(scenario())
    snapshot = control.snapshot()
    assert snapshot.model_version == "v7" and snapshot.enabled
