"""The rollout operations over a real repository (SQLite) and a fleet of fake engines: a retire
that waits for a long request holds up no other admin change, and a rollback while it waits
turns it into a 409 with the version ready again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.memory_budget import MemoryBudget
from gateway.errors import ConflictError
from gateway.model_fleet import ModelFleet
from gateway.model_rollout import ModelRollout
from tenancy.db import Database
from tenancy.migrate import upgrade
from tenancy.model_version_records import ModelVersionState, TrafficPlan
from tenancy.model_versions import ModelVersionRepo
from tests.gateway.test_model_fleet import MIB, Factory, spec

State = ModelVersionState


@pytest.fixture
def rollout(tmp_path: Path) -> ModelRollout:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    return ModelRollout(ModelFleet(Factory(), MemoryBudget(8 * MIB)), ModelVersionRepo(db))


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
