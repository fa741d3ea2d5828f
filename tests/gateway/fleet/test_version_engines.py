"""Engines for model versions, real ones (a tiny random Llama): the footprint from config.json,
the KV pool and cache key the engine gets, the default budget, and that a retire lets go of the
whole engine (nothing keeps its weights or KV tensors alive)."""

from __future__ import annotations

import asyncio
import functools
import gc
import weakref
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.kv.memory_budget import MemoryBudget
from weir.engine.runner.loader import load_model_config
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.version_engines import VersionEngineFactory, default_budget_bytes, memory_in_use
from weir.gateway.server.bootstrap import engine_config
from weir.gateway.settings.settings import CpuRowWeightsMode, Settings
from weir.tenancy.catalog.model_version_records import ModelVersionSpec


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-version"), arch="llama", num_kv_heads=2)


def _factory(settings: Settings, budget: MemoryBudget) -> VersionEngineFactory:
    return VersionEngineFactory(
        settings, "cpu", budget, functools.partial(engine_config, settings, device="cpu")
    )


def test_the_footprint_is_weights_plus_the_explicit_kv_pool(tiny: Path) -> None:
    rows = Settings(kv_cache_tokens=1000, cpu_row_weights=CpuRowWeightsMode.ON)
    factory = _factory(rows, MemoryBudget(1 << 30))
    config = load_model_config(tiny)
    own = factory.footprint(ModelVersionSpec(name="m", version="v1", path=str(tiny), kv_cache_tokens=64))
    # the row weights' copies (engine/models/packed_linear.py) count where they are on
    assert own.weights_bytes == (config.num_params() + config.linear_params()) * 4 and own.kv_tokens == 64
    assert own.kv_bytes_per_token == config.kv_bytes_per_token(4)
    auto = _factory(Settings(kv_cache_tokens=1000), MemoryBudget(1 << 30))
    server = auto.footprint(ModelVersionSpec(name="m", version="v1", path=str(tiny), dtype="bfloat16"))
    assert server.kv_tokens == 1000 and server.weights_bytes == config.num_params() * 2
    no_rows = _factory(Settings(cpu_row_weights=CpuRowWeightsMode.OFF), MemoryBudget(1 << 30))
    plain = no_rows.footprint(ModelVersionSpec(name="m", version="v1", path=str(tiny)))
    assert plain.weights_bytes == config.num_params() * 4


def test_the_default_budget_follows_the_setting() -> None:
    assert default_budget_bytes(Settings(memory_budget_mib=3), "cpu") == 3 * 2**20
    assert default_budget_bytes(Settings(), "cpu") > 0
    assert (memory_in_use("cpu") or 0) > 0


def test_a_loaded_version_is_keyed_by_its_id_and_a_retire_frees_the_whole_engine(tiny: Path) -> None:
    budget = MemoryBudget(1 << 30)
    fleet = ModelFleet(_factory(Settings(), budget), budget)
    spec = ModelVersionSpec(name="m", version="v1", path=str(tiny), kv_cache_tokens=64)

    async def scenario() -> weakref.ref[object]:
        entry = await fleet.load(spec)
        assert entry.state.value == "ready", entry.failure_reason
        engine = entry.engine
        assert engine is not None
        core = engine.core  # type: ignore[attr-defined]
        assert (
            core.config.model_version == "m@v1" and core.kv.num_total_blocks == 64 // 16
        )  # + the null block
        ref = weakref.ref(core)
        del engine, core
        fleet.drain("m@v1")
        result = await fleet.retire("m@v1")
        assert (
            result.released_budget_bytes
            == budget.total_bytes - budget.free_bytes + result.released_budget_bytes
        )
        return ref

    ref = asyncio.run(scenario())
    gc.collect()
    assert ref() is None  # weights, KV tensors and scheduler are gone with the engine
    assert budget.reserved_bytes == 0
