"""The rollout operations over a real repository (SQLite) and a fleet of fake engines: neither a
long load nor a retire that waits for a long request holds up other admin changes; a rollback
while a retire waits turns it into a 409 with the version ready again; a second load of a version
being loaded is a 409."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.memory_budget import MemoryBudget, VersionFootprint
from gateway.errors import ConflictError
from gateway.fleet_types import BuiltEngine
from gateway.model_fleet import ModelFleet
from gateway.model_rollout import ModelRollout
from tenancy.db import Database
from tenancy.errors import InvalidModelTransitionError
from tenancy.migrate import upgrade
from tenancy.model_version_records import ModelVersionSpec, ModelVersionState, TrafficPlan
from tenancy.model_versions import ModelVersionRepo
from tests.gateway.test_model_fleet import MIB, Factory, spec

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
    for v in ("v1", "v2"):
        await rollout.register(spec(v), "test")
        assert (await rollout.load("m", v, "test")).state is State.READY


def test_a_retire_waiting_for_a_long_request_holds_up_no_other_admin_change(rollout: ModelRollout) -> None:
    async def scenario() -> None:
        await _two_ready_versions(rollout)
        lease = rollout.fleet.route("m", "t", "r")  # no plan: v2, ready last; a long stream
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
