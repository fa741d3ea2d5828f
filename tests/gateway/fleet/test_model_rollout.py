"""The rollout operations over a real repository (SQLite) and a fleet of fake engines: neither a
long load nor a retire that waits for a long request holds up other admin changes; a rollback
while a retire waits turns it into a 409 with the version ready again; a second load of a version
being loaded is a 409. Issue 21 item 5: a restart after a crash mid-drain reconciles the records
and the fleet before anything else; a load without a plan takes no traffic until one is set."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.fleet.test_model_fleet import MIB, Factory, spec
from weir.engine.kv.memory_budget import MemoryBudget, VersionFootprint
from weir.gateway.fleet.fleet_types import BuiltEngine
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.errors import ConflictError
from weir.migrations.migrate import upgrade
from weir.tenancy.catalog.model_version_records import ModelVersionSpec, TrafficPlan
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.errors import InvalidModelTransitionError
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import ModelVersionState

State = ModelVersionState


class SlowFactory(Factory):
    """Builds of a version whose path is "slow" wait until `go` is set (large weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def build(self, spec: ModelVersionSpec, footprint: VersionFootprint, model_version: str) -> BuiltEngine:
        if spec.path == "slow":
            assert self.go.wait(10)
        return super().build(spec, footprint, model_version)


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[ModelRollout]:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    yield ModelRollout(ModelFleet(SlowFactory(), MemoryBudget(8 * MIB)), ModelVersionRepo(db))
    db.dispose()


async def _two_ready_versions(rollout: ModelRollout) -> None:
    """v1 and v2 ready, all traffic on v2."""
    for v in ("v1", "v2"):
        await rollout.register(spec(v), "test")
        assert (await rollout.load("m", v, "test")).state is State.READY
    await rollout.set_traffic(TrafficPlan(name="m", split={"v2": 100}, pins={}), "test")


def test_a_retire_waiting_for_a_long_request_holds_up_no_other_admin_change(rollout: ModelRollout) -> None:
    async def scenario() -> None:
        await _two_ready_versions(rollout)
        lease = rollout.fleet.route("m", "t", "r")  # a long stream on v2
        assert lease.version.id == "m@v2"
        await rollout.drain("m", "v2", "test")
        retire = asyncio.create_task(rollout.retire("m", "v2", "test"))
        await asyncio.sleep(0.05)
        assert not retire.done()
        plan = TrafficPlan(name="m", split={"v1": 100}, pins={})
        assert (await asyncio.wait_for(rollout.set_traffic(plan, "test"), 2)).split == {"v1": 100}
        lease.release()
        assert (await asyncio.wait_for(retire, 2)).state is State.RETIRED

    asyncio.run(scenario())


def test_a_rollback_while_a_retire_waits_answers_the_retire_with_409(rollout: ModelRollout) -> None:
    async def scenario() -> None:
        await _two_ready_versions(rollout)
        lease = rollout.fleet.route("m", "t", "r")
        await rollout.drain("m", "v2", "test")
        retire = asyncio.create_task(rollout.retire("m", "v2", "test"))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(rollout.rollback("m", "v2", "test"), 2)
        with pytest.raises(ConflictError, match="ready"):
            await asyncio.wait_for(retire, 2)
        entry = rollout.fleet.get("m@v2")
        assert entry is not None and entry.state is State.READY and entry.engine is not None
        lease.release()

    asyncio.run(scenario())


def test_a_long_load_holds_up_no_other_admin_change_and_a_second_load_is_refused(
    rollout: ModelRollout,
) -> None:
    async def scenario() -> None:
        await _two_ready_versions(rollout)
        await rollout.register(spec("v3", path="slow"), "test")
        load = asyncio.create_task(rollout.load("m", "v3", "test"))
        await asyncio.sleep(0.05)
        assert not load.done()
        with pytest.raises(InvalidModelTransitionError):  # 409
            await asyncio.wait_for(rollout.load("m", "v3", "test"), 2)
        await asyncio.wait_for(rollout.drain("m", "v2", "test"), 2)
        assert (await asyncio.wait_for(rollout.rollback("m", "v1", "test"), 2)).split == {"v1": 100}
        assert isinstance(rollout.fleet.factory, SlowFactory)
        rollout.fleet.factory.go.set()
        assert (await asyncio.wait_for(load, 5)).state is State.READY

    asyncio.run(scenario())


def _restarted(rollout: ModelRollout) -> ModelRollout:
    """A new server (an empty fleet) on the same database, as after kill -9 and a restart."""
    return ModelRollout(ModelFleet(SlowFactory(), MemoryBudget(8 * MIB)), rollout.repo)


def test_after_a_crash_mid_drain_the_restart_retires_it_and_a_load_works(rollout: ModelRollout) -> None:
    """Issue 21 item 5: the fleet was filled from records read before `draining` became
    `retired`, so it knew the version as draining; its load answered 500 and left it `loading`."""

    async def scenario() -> None:
        await _two_ready_versions(rollout)
        await rollout.rollback("m", "v1", "test")  # v2 draining, as when the server was killed
        assert rollout.repo.get("m", "v2").state is State.DRAINING
        restarted = _restarted(rollout)
        await restarted.start(None)
        entry = restarted.fleet.get("m@v2")
        assert entry is not None and entry.state is State.RETIRED
        assert rollout.repo.get("m", "v2").state is State.RETIRED
        assert (await restarted.load("m", "v2", "test")).state is State.READY
        assert rollout.repo.get("m", "v2").state is State.READY
        # Every transition from here works or is a 409 naming the state.
        await restarted.drain("m", "v2", "test")
        assert (await restarted.retire("m", "v2", "test")).state is State.RETIRED
        with pytest.raises(ConflictError, match="retired"):
            await restarted.retire("m", "v2", "test")
        with pytest.raises(InvalidModelTransitionError, match="retired"):
            await restarted.drain("m", "v2", "test")
        with pytest.raises(ConflictError, match="not loaded"):
            await restarted.rollback("m", "v2", "test")
        await restarted.fleet.shutdown()

    asyncio.run(scenario())


def test_a_load_the_fleet_refuses_is_a_409_that_leaves_the_record_as_it_was(rollout: ModelRollout) -> None:
    async def scenario() -> None:
        await _two_ready_versions(rollout)
        await rollout.drain("m", "v2", "test")
        entry = rollout.fleet.get("m@v2")
        assert entry is not None
        rollout.repo.set_state("m", "v2", State.RETIRED, actor="cli")  # the database moved on alone
        with pytest.raises(ConflictError, match="draining") as info:
            await rollout.load("m", "v2", "test")
        assert info.value.status_code == 409 and "retired" in info.value.message
        assert rollout.repo.get("m", "v2").state is State.RETIRED  # not stuck in `loading`

    asyncio.run(scenario())


def test_a_load_without_a_plan_takes_no_traffic_until_one_is_set(rollout: ModelRollout) -> None:
    """Issue 21 item 5: with no stored plan the router sends everything to the version ready
    last, so a load cut every request over the moment it was ready."""

    async def scenario() -> None:
        await rollout.register(spec("v1"), "test")
        await rollout.load("m", "v1", "test")
        assert rollout.repo.get_traffic("m").split == {}  # one version, no plan: it serves
        assert rollout.fleet.route("m", "t", "r0").version.id == "m@v1"
        await rollout.register(spec("v2"), "test")
        assert (await rollout.load("m", "v2", "test")).state is State.READY
        assert {rollout.fleet.route("m", "t", f"r{i}").version.id for i in range(50)} == {"m@v1"}
        assert rollout.repo.get_traffic("m").split == {"v1": 100}  # held, and kept across a restart
        await rollout.set_traffic(TrafficPlan(name="m", split={"v1": 50, "v2": 50}, pins={}), "test")
        routed = {rollout.fleet.route("m", "t", f"r{i}").version.id for i in range(50)}
        assert routed == {"m@v1", "m@v2"}
        restarted = _restarted(rollout)
        await restarted.start(None)
        assert restarted.fleet.plan("m").split == {"v1": 50, "v2": 50}
        await restarted.fleet.shutdown()

    asyncio.run(scenario())
