"""AdapterRollout over a real fleet, budget and database with a fake engine: a loaded adapter's
host copy is reserved in the memory budget and released at unload; one that does not fit is
refused (409 memory_budget_exceeded), recorded failed and not left on the engine; an unload
waits for the requests through the adapter to settle; a restart loads what was loaded and
records what cannot be loaded as failed; retiring the base version unloads its adapters."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import tokenizer
from weir.engine.kv.memory_budget import MemoryBudget, MemoryBudgetError, adapter_owner
from weir.engine.lora.lora_types import AdapterInfo, AdapterLoadError, UnknownAdapterError
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.fleet.adapter_rollout import AdapterRollout
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.errors import ConflictError, to_http_error
from weir.migrations.migrate import upgrade
from weir.tenancy.catalog.adapter_records import AdapterSpec
from weir.tenancy.catalog.adapters import AdapterRepo
from weir.tenancy.catalog.model_versions import ModelVersionRepo, ModelVersionSpec, ModelVersionState
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AdapterState

ACTOR = "test"
VID = "tiny@v1"
ADAPTER_BYTES = 1000


class LoraFakeEngine(FakeEngine):
    """A fake engine that holds adapters by name; folders named 'bad*' are refused."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, AdapterInfo] = {}

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        if path.startswith("bad"):
            raise AdapterLoadError(f"{path}: LoRA weights contain NaN or Inf")
        info = AdapterInfo(name, path, 4, ("q_proj",), "f" * 32, ADAPTER_BYTES, None, 0, 0, 0, 0)
        self.held[name] = info
        return info

    async def unload_adapter(self, name: str) -> AdapterInfo:
        if name not in self.held:
            raise UnknownAdapterError(name)
        return self.held.pop(name)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(database.engine)
    TenancyRepo(database, KeyHasher(b"p")).create_tenant(TenantSpec("acme"), actor=ACTOR)
    ModelVersionRepo(database).register(ModelVersionSpec("tiny", "v1", "/models/tiny"), actor=ACTOR)
    return database


def _fleet(engine: LoraFakeEngine, budget_bytes: int) -> ModelFleet:
    fleet = ModelFleet(budget=MemoryBudget(budget_bytes))
    fleet.add_ready(
        ModelVersionSpec("tiny", "v1", "/models/tiny"),
        engine,
        tokenizer(),
        max_model_len=128,
        fingerprint="fp",
    )
    return fleet


def test_adapters_are_reserved_in_the_budget_and_released_at_unload(db: Database) -> None:
    engine = LoraFakeEngine()
    fleet = _fleet(engine, 2500)
    repo = AdapterRepo(db)
    rollout = AdapterRollout(fleet, repo, AdapterCatalog())
    assert fleet.budget is not None

    async def main() -> None:
        for name in ("a", "b", "c"):
            await rollout.register(AdapterSpec(name, VID, name), ACTOR)
        await rollout.load("a", ACTOR)
        await rollout.load("b", ACTOR)
        assert fleet.budget.held(adapter_owner(VID, "a")) == ADAPTER_BYTES
        assert fleet.budget.reserved_bytes == 2 * ADAPTER_BYTES
        with pytest.raises(MemoryBudgetError) as full:
            await rollout.load("c", ACTOR)  # 500 bytes left
        error = to_http_error(full.value)
        assert error.status_code == 409 and error.code == "memory_budget_exceeded"
        assert "c" not in engine.held and not rollout.catalog.has("c")
        assert repo.get("c").state is AdapterState.FAILED
        await rollout.unload("a", ACTOR)
        assert fleet.budget.held(adapter_owner(VID, "a")) == 0 and "a" not in engine.held
        status = await rollout.load("c", ACTOR)  # fits now
        assert status.record.state is AdapterState.LOADED and status.serving

    asyncio.run(main())


def test_a_refused_folder_is_recorded_failed_with_its_reason(db: Database) -> None:
    engine = LoraFakeEngine()
    rollout = AdapterRollout(_fleet(engine, 10**6), AdapterRepo(db), AdapterCatalog())

    async def main() -> None:
        await rollout.register(AdapterSpec("x", VID, "bad-nan"), ACTOR)
        with pytest.raises(AdapterLoadError) as refused:
            await rollout.load("x", ACTOR)
        error = to_http_error(refused.value)
        assert error.status_code == 400 and error.code == "invalid_adapter" and error.param == "path"
        record = (await rollout.get("x")).record
        assert record.state is AdapterState.FAILED and "NaN or Inf" in (record.failure_reason or "")
        assert rollout.fleet.budget is not None and rollout.fleet.budget.reserved_bytes == 0

    asyncio.run(main())


def test_unload_waits_for_the_requests_through_the_adapter(db: Database) -> None:
    engine = LoraFakeEngine()
    fleet = _fleet(engine, 10**6)
    rollout = AdapterRollout(fleet, AdapterRepo(db), AdapterCatalog())

    async def main() -> None:
        await rollout.register(AdapterSpec("a", VID, "a"), ACTOR)
        await rollout.load("a", ACTOR)
        lease = fleet.route_version(VID, "a")  # a request through it, not settled yet
        unload = asyncio.create_task(rollout.unload("a", ACTOR))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not unload.done() and "a" in engine.held  # waiting for the request
        assert not rollout.catalog.has("a")  # but no new request is routed to it
        lease.release()
        status = await unload
        assert status.record.state is AdapterState.UNLOADED and "a" not in engine.held

    asyncio.run(main())


def test_a_base_version_that_is_not_loaded_is_a_conflict(db: Database) -> None:
    fleet = ModelFleet(budget=MemoryBudget(10**6))
    rollout = AdapterRollout(fleet, AdapterRepo(db), AdapterCatalog())

    async def main() -> None:
        await rollout.register(AdapterSpec("a", VID, "a"), ACTOR)
        with pytest.raises(ConflictError) as conflict:
            await rollout.load("a", ACTOR)
        assert conflict.value.code == "model_version_not_ready"

    asyncio.run(main())


def test_start_reloads_loaded_adapters_and_fails_the_others(db: Database) -> None:
    repo = AdapterRepo(db)
    for name, path in (("good", "good"), ("gone", "bad-gone")):
        repo.register(AdapterSpec(name, VID, path, "acme"), actor=ACTOR)
        repo.set_state(name, AdapterState.LOADED, actor=ACTOR)
    engine = LoraFakeEngine()
    rollout = AdapterRollout(_fleet(engine, 10**6), repo, AdapterCatalog())
    asyncio.run(rollout.start())
    assert set(engine.held) == {"good"} and rollout.catalog.names() == ["good"]
    assert rollout.catalog.resolve("good", "acme") is not None
    gone = repo.get("gone")
    assert gone.state is AdapterState.FAILED and "could not load at start-up" in (gone.failure_reason or "")


def test_retiring_the_base_version_releases_its_adapters_budget(db: Database) -> None:
    engine = LoraFakeEngine()
    fleet = _fleet(engine, 10**6)
    rollout = AdapterRollout(fleet, AdapterRepo(db), AdapterCatalog())
    assert fleet.budget is not None

    async def main() -> None:
        await rollout.register(AdapterSpec("a", VID, "a"), ACTOR)
        await rollout.load("a", ACTOR)
        assert fleet.budget is not None and fleet.budget.reserved_bytes == ADAPTER_BYTES
        fleet.drain(VID)
        result = await fleet.retire(VID)
        assert result.released_budget_bytes == ADAPTER_BYTES and fleet.budget.reserved_bytes == 0

    asyncio.run(main())


def test_retiring_the_base_version_through_the_rollout_unloads_its_adapters(db: Database) -> None:
    engine = LoraFakeEngine()
    fleet = _fleet(engine, 10**6)
    versions = ModelVersionRepo(db)
    for state in (ModelVersionState.LOADING, ModelVersionState.READY):
        versions.set_state("tiny", "v1", state, actor=ACTOR)
    repo = AdapterRepo(db)
    adapters = AdapterRollout(fleet, repo, AdapterCatalog())
    models = ModelRollout(fleet, versions)
    models.retire_hooks.append(adapters.version_retired)  # as gateway/server/bootstrap.py wires it

    async def main() -> None:
        await adapters.register(AdapterSpec("a", VID, "a", "acme"), ACTOR)
        await adapters.load("a", ACTOR)
        assert adapters.catalog.resolve("a", "acme") is not None
        # Its only version: the rollout guards ask for force.
        await models.drain("tiny", "v1", ACTOR, force=True)
        await models.retire("tiny", "v1", ACTOR, force=True)
        status = await adapters.get("a")
        assert status.record.state is AdapterState.UNLOADED and not status.serving
        assert adapters.catalog.resolve("a", "acme") is None
        assert fleet.budget is not None and fleet.budget.reserved_bytes == 0
        # A restart loads nothing onto the retired version, and fails nothing.
        restarted = AdapterRollout(fleet, AdapterRepo(db), AdapterCatalog())
        await restarted.start()
        assert restarted.catalog.names() == [] and repo.get("a").state is AdapterState.UNLOADED
        # Loading it again needs its base version ready first.
        with pytest.raises(ConflictError):
            await adapters.load("a", ACTOR)

    asyncio.run(main())
