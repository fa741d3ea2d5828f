"""The store tier in the engine, over a real redis-server and a tiny random Llama: a prompt
computed by one engine is served from the store by another with the same greedy tokens, only in
its own cache scope; tampered values, a paused store and an admin flush degrade to recompute;
and while one request waits for its blocks, the others keep stepping."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.redis_server import RedisServer
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, KVStoreConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import RequestStatus, SamplingParams

SECRET = b"t" * 32
PROMPT = tuple(range(3, 200))  # 12 full blocks of 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-kv-store"), num_kv_heads=2, max_position_embeddings=512
    )


def _engine(path: Path, server: RedisServer | None, version: str = "default", **store) -> LLMEngine:  # type: ignore[no-untyped-def]
    return build_engine(
        EngineConfig(
            model_path=str(path),
            model_version=version,
            cache=CacheConfig(block_size=16, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512),
            kv_store=KVStoreConfig(url=server.url, secret=SECRET, **store) if server is not None else None,
        )
    )


def _run(
    engine: LLMEngine, rid: str, prompt: tuple[int, ...] = PROMPT, scope: str = "t1"
) -> tuple[list[int], int]:
    """Greedy tokens of one request and the prompt tokens it was served from cache."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest(rid, prompt, params, tenant_id=scope, cache_scope=scope))
    tokens: list[int] = []
    cached = -1
    for _ in range(20_000):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            tokens.extend(out.new_token_ids)
            cached = out.num_cached_tokens
        if engine.last_step_idle:
            time.sleep(0.002)  # a fetch is on the store's thread
    assert not engine.has_unfinished()
    return tokens, cached


def _flush_writes(engine: LLMEngine) -> None:
    """The idle engine hands the finished request's blocks to the write queue; wait for the store."""
    engine.run_pending_transfers()
    assert engine.store_io is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and engine.stats().kv_store.io.num_written_blocks < 12:  # type: ignore[union-attr]
        time.sleep(0.01)


def test_a_prompt_computed_on_one_engine_is_served_from_the_store_on_another(
    tiny: Path, redis_server: RedisServer
) -> None:
    cold, _ = _run(_engine(tiny, None), "cold")
    a = _engine(tiny, redis_server)
    first, cached = _run(a, "a")
    assert first == cold and cached == 0
    _flush_writes(a)
    b = _engine(tiny, redis_server)
    second, cached = _run(b, "b")
    assert second == cold
    assert cached == 12 * 16  # every full prompt block; the partial last one is computed
    stats = b.stats().kv_store
    assert stats is not None
    assert stats.decisions.num_fetched == 1 and stats.decisions.num_landed_blocks == 12
    assert stats.io.num_hit_blocks == 12 and stats.io.bytes_read == 12 * stats.value_bytes


def test_another_scope_never_gets_the_blocks(tiny: Path, redis_server: RedisServer) -> None:
    a = _engine(tiny, redis_server)
    _run(a, "a", scope="tenant-a")
    _flush_writes(a)
    b = _engine(tiny, redis_server)
    _, cached = _run(b, "b", scope="tenant-b")
    assert cached == 0
    stats = b.stats().kv_store
    assert stats is not None and stats.io.num_hit_blocks == 0 and stats.decisions.num_landed_blocks == 0


def test_a_tampered_value_is_refused_and_the_rest_recomputes(tiny: Path, redis_server: RedisServer) -> None:
    cold, _ = _run(_engine(tiny, None), "cold")
    a = _engine(tiny, redis_server)
    _run(a, "a")
    _flush_writes(a)
    r = redis_server.client()
    keys = sorted(r.keys("weir:kv:*"))
    assert len(keys) >= 12
    for key in keys:
        value = bytearray(r.get(key))
        value[100] ^= 1  # one bit of KV flipped in every block
        r.set(key, bytes(value))
    b = _engine(tiny, redis_server)
    tokens, cached = _run(b, "b")
    assert tokens == cold and cached == 0
    stats = b.stats().kv_store
    assert stats is not None and stats.io.num_bad_mac == 1  # the first ends the chain


def test_a_paused_store_degrades_to_recompute_while_others_step(
    tiny: Path, redis_server: RedisServer
) -> None:
    cold, _ = _run(_engine(tiny, None), "cold")
    short = tuple(range(250, 262))  # no full block: nothing to fetch, it runs at once
    other_cold, _ = _run(_engine(tiny, None), "cold2", short)
    engine = _engine(tiny, redis_server, timeout_s=3.0)
    redis_server.pause()
    try:
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        engine.add_request(EngineRequest("x", PROMPT, params, tenant_id="t1", cache_scope="t1"))
        engine.step()
        x = engine.scheduler.requests["x"]
        assert x.status is RequestStatus.FETCHING_KV
        engine.add_request(EngineRequest("y", short, params, tenant_id="t2", cache_scope="t2"))
        got: list[int] = []
        while not got:
            for out in engine.step():
                if out.request_id == "y":
                    got.extend(out.new_token_ids)
        assert x.status is RequestStatus.FETCHING_KV  # y stepped while x waits for the store
        tokens: dict[str, list[int]] = {"x": [], "y": got}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
            if engine.last_step_idle:
                time.sleep(0.005)
        assert tokens == {"x": cold, "y": other_cold}
        assert x.num_cached_tokens == 0 and x.status is RequestStatus.FINISHED_LENGTH
    finally:
        redis_server.resume()


def test_an_admin_flush_of_a_scope_reaches_the_store(tiny: Path, redis_server: RedisServer) -> None:
    a = _engine(tiny, redis_server)
    _run(a, "a", scope="t1")
    _run(a, "b", tuple(range(210, 250)), scope="t2")
    _flush_writes(a)
    r = redis_server.client()
    before = len(r.keys("weir:kv:*"))
    assert a.prefix_cache.flush(tenant_id="t1").num_blocks_flushed >= 12
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(r.keys("weir:kv:*")) == before:
        time.sleep(0.01)
    assert len(r.keys("weir:kv:*")) == before - 12  # t1's 12 blocks; t2's 2 stay
    assert not a.kv.copy_plan.has_pending_transfers()


def test_retiring_a_version_drops_its_entries_and_only_its(tiny: Path, redis_server: RedisServer) -> None:
    old, new = _engine(tiny, redis_server, version="v1"), _engine(tiny, redis_server, version="v2")
    for engine in (old, new):
        _run(engine, "a")
        _flush_writes(engine)
    r = redis_server.client()
    assert len(r.keys("weir:kv:*")) == 24  # the same tokens under two versions: two chains
    old.prefix_cache.flush(include_pinned=True)  # what retiring v1 does before its engine stops
    assert old.store_io is not None
    old.store_io.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(r.keys("weir:kv:*")) > 12:
        time.sleep(0.01)
    assert len(r.keys("weir:kv:*")) == 12
    _, cached = _run(_engine(tiny, redis_server, version="v2"), "b")
    assert cached == 12 * 16  # v2's chain is intact


def test_a_request_aborted_while_it_waits_for_the_store_frees_everything(
    tiny: Path, redis_server: RedisServer
) -> None:
    engine = _engine(tiny, redis_server, timeout_s=3.0)
    redis_server.pause()
    try:
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        engine.add_request(EngineRequest("x", PROMPT, params, tenant_id="t1", cache_scope="t1"))
        engine.step()
        assert engine.scheduler.requests["x"].status is RequestStatus.FETCHING_KV
        (out,) = engine.abort("x")
        assert out.finished and not engine.has_unfinished()
        store = engine.kv.store
        assert store is not None and store._held_bytes == 0 and not store._fetches
        assert (
            not engine.scheduler.admission.fetching
            and engine.kv.num_free_blocks == engine.kv.num_total_blocks
        )
        engine.step()  # the late answer, when it comes, finds nobody: nothing breaks
    finally:
        redis_server.resume()
