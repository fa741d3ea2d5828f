"""The fleet of model versions: load within the budget (ready only after the warm-up), failures
that change nothing else, routing only to ready versions, drain that lets requests finish, retire
that waits for them and gives everything back. Engines are the gateway's fake engine with a
start/shutdown lifecycle; the routing and the budget are the real ones."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.fake_engine import FakeEngine, FakePrefixCache
from tests.gateway.harness import tokenizer
from weir.engine.kv.memory_budget import MemoryBudget, VersionFootprint
from weir.gateway.fleet.fleet_types import BuiltEngine
from weir.gateway.fleet.model_fleet import ModelFleet, NoModelVersionError
from weir.gateway.fleet.traffic_router import RoutePlan
from weir.tenancy.catalog.model_version_records import ModelVersionSpec
from weir.tenancy.store.enums import ModelVersionState

State = ModelVersionState
MIB = 2**20


class LifecycleEngine(FakeEngine):
    """A fake engine with the lifecycle the fleet drives; its warm-up may fail."""

    def __init__(self, fail_warmup: bool = False) -> None:
        super().__init__()
        self.fail_warmup = fail_warmup
        self.started = self.stopped = False
        self.prefix_cache = FakePrefixCache()

    async def start(self, warmup: bool = True) -> None:
        if self.fail_warmup:
            raise RuntimeError("warm-up generation failed")
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True


class Factory:
    """Footprints from the spec's kv_cache_tokens (1 byte per token, 1 MiB of weights)."""

    def __init__(self) -> None:
        self.built: dict[str, LifecycleEngine] = {}

    def footprint(self, spec: ModelVersionSpec) -> VersionFootprint:
        if spec.path == "missing":
            raise FileNotFoundError("model folder 'missing' does not exist")
        return VersionFootprint(MIB, spec.kv_cache_tokens or 16, 1, 16)

    def build(self, spec: ModelVersionSpec, footprint: VersionFootprint, model_version: str) -> BuiltEngine:
        assert model_version == spec.id  # the cache key of the engine is the version's id
        engine = LifecycleEngine(fail_warmup=spec.path == "bad-warmup")
        self.built[spec.id] = engine
        return BuiltEngine(engine, tokenizer(), 512, len(tokenizer()))


def spec(version: str, path: str = "ok", kv: int | None = None, name: str = "m") -> ModelVersionSpec:
    return ModelVersionSpec(name=name, version=version, path=path, kv_cache_tokens=kv)


@pytest.fixture
def fleet() -> ModelFleet:
    return ModelFleet(Factory(), MemoryBudget(8 * MIB))


def test_a_load_is_ready_after_warm_up_and_reserves_its_footprint(fleet: ModelFleet) -> None:
    v1 = asyncio.run(fleet.load(spec("v1", kv=1024)))
    assert v1.state is State.READY and v1.failure_reason is None
    assert fleet.budget is not None and fleet.budget.held("m@v1") == MIB + (1024 // 16 + 1) * 16
    assert [m.name for m in fleet.served_models()] == ["m"] and fleet.serves("m")


def test_a_load_makes_the_tokenizer_copies_of_the_pool_workers_before_it_serves() -> None:
    fleet = ModelFleet(Factory(), MemoryBudget(8 * MIB), tokenizer_copies=3)
    v1 = asyncio.run(fleet.load(spec("v1")))
    assert v1.state is State.READY and v1.prompts is not None and v1.prompts.num_copies == 3


@pytest.mark.parametrize(
    ("path", "kv", "words"),
    [("missing", None, "does not exist"), ("bad-warmup", None, "warm-up"), ("ok", 64 * MIB, "does not fit")],
)
def test_a_failed_load_is_failed_with_its_reason_and_changes_nothing_else(
    fleet: ModelFleet, path: str, kv: int | None, words: str
) -> None:
    asyncio.run(fleet.load(spec("v1")))
    assert fleet.budget is not None
    held = fleet.budget.reserved_bytes
    v2 = asyncio.run(fleet.load(spec("v2", path=path, kv=kv)))
    assert v2.state is State.FAILED and words in (v2.failure_reason or "")
    assert v2.engine is None and fleet.budget.reserved_bytes == held
    assert fleet.route("m", "t", "r").version.id == "m@v1"
    if path == "bad-warmup":
        assert isinstance(fleet.factory, Factory) and fleet.factory.built["m@v2"].stopped


def test_routing_follows_pins_and_split_and_never_picks_a_draining_version(fleet: ModelFleet) -> None:
    for v in ("v1", "v2"):
        asyncio.run(fleet.load(spec(v)))
    fleet.set_plan("m", RoutePlan(split={"v2": 100}, pins={"acme": "v1"}))
    assert fleet.route("m", "acme", "r1").version.spec.version == "v1"
    assert fleet.route("m", "other", "r2").version.spec.version == "v2"
    fleet.drain("m@v1")
    assert fleet.route("m", "acme", "r3").version.spec.version == "v2"
    fleet.drain("m@v2")
    with pytest.raises(NoModelVersionError):
        fleet.route("m", "acme", "r4")
    assert not fleet.serves("m") and fleet.served_models() == []


def test_each_tenant_sees_the_card_of_the_version_that_serves_it(fleet: ModelFleet) -> None:
    """Issue 21 item 5: every tenant saw the card of the version ready last, here v1 (loaded
    again after v2 and pinned to acme), though only acme is served by it."""
    asyncio.run(fleet.load(spec("v2", kv=256)))
    asyncio.run(fleet.load(spec("v1", kv=1024)))  # ready last
    fleet.set_plan("m", RoutePlan(split={"v2": 100}, pins={"acme": "v1"}))
    v1, v2 = fleet.get("m@v1"), fleet.get("m@v2")
    assert v1 is not None and v2 is not None and v1.served is not None and v2.served is not None
    assert v1.served.fingerprint != v2.served.fingerprint
    assert fleet.served_models("acme") == [v1.served]
    assert fleet.served_models("other") == [v2.served]
    assert fleet.served_models() == [v2.served]  # no tenant: the unpinned traffic's version
    for tenant, served in (("acme", v1), ("other", v2)):
        assert fleet.route("m", tenant, "r").version is served  # the card is what routes
    fleet.drain("m@v1")  # a pin to a version that takes no requests: the split's
    assert fleet.served_models("acme") == [v2.served]


def test_different_names_are_served_side_by_side(fleet: ModelFleet) -> None:
    asyncio.run(fleet.load(spec("v1", name="alpha")))
    asyncio.run(fleet.load(spec("v1", name="beta")))
    assert [m.name for m in fleet.served_models()] == ["alpha", "beta"]
    assert fleet.route("beta", "t", "r").version.id == "beta@v1"
    assert set(fleet.stats_by_version()) == {"alpha@v1", "beta@v1"}
    assert fleet.stats().num_total_blocks == 2 * fleet.stats_by_version()["alpha@v1"].num_total_blocks


def test_retire_waits_for_requests_in_flight_then_frees_everything(fleet: ModelFleet) -> None:
    async def scenario() -> None:
        await fleet.load(spec("v1"))
        await fleet.load(spec("v2"))
        lease = fleet.route("m", "t", "r")  # no plan: the version ready last
        assert lease.version.id == "m@v2" and lease.version.in_flight == 1
        fleet.drain("m@v2")
        retire = asyncio.create_task(fleet.retire("m@v2"))
        await asyncio.sleep(0.05)
        assert not retire.done()  # the request still runs on v2
        engine = fleet.factory.built["m@v2"]  # type: ignore[union-attr]
        assert not engine.stopped
        lease.release()
        lease.release()  # idempotent
        result = await retire
        assert engine.stopped and ("flush", (None, None, None, True)) in engine.prefix_cache.calls
        assert result.released_budget_bytes > 0
        entry = fleet.get("m@v2")
        assert entry is not None and entry.state is State.RETIRED and entry.engine is None
        assert fleet.budget is not None and fleet.budget.held("m@v2") == 0
        assert fleet.route("m", "t", "r2").version.id == "m@v1"

    asyncio.run(scenario())


def test_retire_needs_a_drain_first_and_undrain_makes_it_ready_again(fleet: ModelFleet) -> None:
    asyncio.run(fleet.load(spec("v1")))
    with pytest.raises(ValueError, match="drain it"):
        asyncio.run(fleet.retire("m@v1"))
    fleet.drain("m@v1")
    fleet.undrain("m@v1")
    assert fleet.route("m", "t", "r").version.id == "m@v1"


def test_a_retired_version_loads_again_and_a_ready_one_cannot_load_twice(fleet: ModelFleet) -> None:
    asyncio.run(fleet.load(spec("v1")))
    with pytest.raises(ValueError, match="ready"):
        asyncio.run(fleet.load(spec("v1")))
    fleet.drain("m@v1")
    asyncio.run(fleet.retire("m@v1"))
    assert asyncio.run(fleet.load(spec("v1"))).state is State.READY


def test_a_dead_version_engine_takes_no_requests_and_the_others_serve_its_share(fleet: ModelFleet) -> None:
    for v in ("v1", "v2"):
        asyncio.run(fleet.load(spec(v)))
    fleet.set_plan("m", RoutePlan(split={"v1": 50, "v2": 50}, pins={"acme": "v1"}))
    assert isinstance(fleet.factory, Factory)
    fleet.factory.built["m@v1"].alive = False  # its loop gave up restarting
    assert {fleet.route("m", "acme", f"r{i}").version.id for i in range(20)} == {"m@v2"}
    assert fleet.health().alive and fleet.health().ready
