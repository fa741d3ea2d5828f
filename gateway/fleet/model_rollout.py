"""Model-version rollouts: the admin operations, each applied to the records and to the fleet.

The records (`weir.tenancy.catalog.model_versions.ModelVersionRepo`) are what survives a restart and what the
audit log sees; the fleet (`weir.gateway.fleet.model_fleet`) is what serves. Each operation moves the record
first where the move must be allowed (the repository's one transition table decides, 409
otherwise), then acts on the fleet, then records the outcome (ready, or failed with its reason).

At start-up `start` registers the `--model` version if it is absent, loads it and every version
recorded as ready, and restores each name's split and pins. Without a database (an app built
around one engine) there is no repository and the fleet alone holds the state, in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from weir.gateway.fleet.model_fleet import FleetVersion, ModelFleet, RetireResult
from weir.gateway.fleet.traffic_router import RoutePlan
from weir.gateway.http.errors import ConflictError
from weir.tenancy.catalog.model_version_records import check_transition
from weir.tenancy.catalog.model_versions import (
    ModelVersionRepo,
    ModelVersionSpec,
    ModelVersionState,
    ModelVersionView,
    TrafficPlan,
)
from weir.tenancy.catalog.rollout_guards import check_keeps_serving, check_plan_serves
from weir.tenancy.errors import ModelVersionExistsError

logger = logging.getLogger("weir.rollout")

State = ModelVersionState
STARTUP_ACTOR = "weir serve"


class StartupLoadError(RuntimeError):
    """The `--model` version could not be loaded at start-up (the server does not start)."""


@dataclass(frozen=True)
class VersionStatus:
    """A version's record with what only the running server knows."""

    record: ModelVersionView
    state: ModelVersionState  # the fleet's when it knows the version, else the record's
    failure_reason: str | None
    traffic_percent: int
    pinned_tenants: tuple[str, ...]
    in_flight: int
    kv_usage: float | None
    retire: RetireResult | None = None  # set on the answer to a retire


class ModelRollout:
    """The admin operations on model versions (see the module docstring)."""

    def __init__(self, fleet: ModelFleet, repo: ModelVersionRepo) -> None:
        self.fleet = fleet
        self.repo = repo
        self._lock = asyncio.Lock()  # one state change at a time (loads are long; reads never wait)
        # Called with a version's id once it is retired (the adapter rollout drops its adapters).
        self.retire_hooks: list[Callable[[str], Awaitable[None]]] = []

    # -- start-up ---------------------------------------------------------------------------------

    async def start(self, startup: ModelVersionSpec | None) -> None:
        """Register and load `startup`; reload the versions recorded as ready; restore the plans."""
        if startup is not None:
            try:
                await asyncio.to_thread(self.repo.register, startup, actor=STARTUP_ACTOR)
            except ModelVersionExistsError:
                pass
        records = []
        for record in await asyncio.to_thread(self.repo.list):
            if record.state is State.DRAINING:
                # Its in-flight requests ended with the old process: the drain is complete. The
                # fleet is filled from the moved record, never the stale one (a version the
                # database calls retired must not be known as draining here: its next load failed).
                record = await asyncio.to_thread(self._set, record, State.RETIRED, None, STARTUP_ACTOR)
            records.append(record)
        for record in records:
            is_startup = startup is not None and record.id == startup.id
            if record.state is State.READY:
                entry = await self.fleet.load(record.spec)
                if entry.state is not State.READY:
                    # The record stays ready (no ready -> failed move): the next start tries again.
                    logger.error("could not reload %s: %s", record.id, entry.failure_reason)
                    if is_startup:
                        raise StartupLoadError(f"could not load {record.id}: {entry.failure_reason}")
            elif record.state is State.LOADING or is_startup:
                # `loading` at start: a load the CLI asked for on the database, or one a crash cut.
                entry = await self._load(record, STARTUP_ACTOR, mark=record.state is not State.LOADING)
                if entry.state is not State.READY and is_startup:
                    raise StartupLoadError(f"could not load {record.id}: {entry.failure_reason}")
            else:
                entry = self.fleet.register(record.spec)
                entry.state, entry.failure_reason = record.state, record.failure_reason
        for name, plan in (await asyncio.to_thread(self.repo.list_traffic)).items():
            self.fleet.set_plan(name, RoutePlan(plan.split, plan.pins))

    # -- operations -------------------------------------------------------------------------------

    async def register(self, spec: ModelVersionSpec, actor: str) -> VersionStatus:
        record = await asyncio.to_thread(self.repo.register, spec, actor=actor)
        self.fleet.register(spec)
        return self.status(record)

    async def load(self, name: str, version: str, actor: str) -> VersionStatus:
        """Load and warm up; the status is ready, or failed with the reason.

        Only the move to `loading` takes the lock: from there the transition table refuses a
        second load, a drain or a retire of the version and `set_traffic` any share of it, so
        the load itself (minutes for large weights) holds up no other admin change, a rollback
        above all.
        """
        async with self._lock:
            record = await asyncio.to_thread(self.repo.get, name, version)
            check_transition(name, version, record.state, State.LOADING)  # the records' 409 first
            _loadable(record, self.fleet.get(record.id))
            await self._hold_current_traffic(name, actor)
            record = await asyncio.to_thread(self._set, record, State.LOADING, None, actor)
        await self._load(record, actor, mark=False)
        return self.status(await asyncio.to_thread(self.repo.get, name, version))

    async def set_traffic(self, plan: TrafficPlan, actor: str) -> TrafficPlan:
        """Store and apply a split and pins; every version with a share or a pin must be ready."""
        async with self._lock:
            states = {v.spec.version: v.state for v in self.fleet.versions() if v.spec.name == plan.name}
            check_plan_serves(plan, states)
            routed = {v for v, p in plan.split.items() if p > 0} | set(plan.pins.values())
            for version in sorted(routed - set(states)):
                # Recorded, but unknown to this server (registered by the CLI since it started).
                raise ConflictError(
                    f"model {plan.name!r} version {version!r} is unknown to this server; "
                    "only ready versions take traffic",
                    param="split",
                    code="model_version_not_ready",
                )
            stored = await asyncio.to_thread(self.repo.set_traffic, plan, actor=actor)
            self.fleet.set_plan(plan.name, RoutePlan(stored.split, stored.pins))
            return stored

    async def traffic(self, name: str) -> TrafficPlan:
        return await asyncio.to_thread(self.repo.get_traffic, name)

    async def drain(self, name: str, version: str, actor: str, force: bool = False) -> VersionStatus:
        """No new requests; in-flight ones finish on it. The last ready version of its model is
        drained only with `force` (409 `last_serving_version` otherwise)."""
        async with self._lock:
            record = await asyncio.to_thread(self.repo.get, name, version)
            entry = self.fleet.get(record.id)
            if entry is not None and entry.state is State.READY:
                ready = [v.spec.version for v in self.fleet.routable(name)]
                check_keeps_serving(name, version, ready, "drain", force=force)
            record = await asyncio.to_thread(self._set, record, State.DRAINING, None, actor)
            if self.fleet.get(record.id) is not None:
                self.fleet.drain(record.id)
            return self.status(record)

    async def retire(self, name: str, version: str, actor: str, force: bool = False) -> VersionStatus:
        """After its drain completes: unload it, flush its cached blocks, free its memory; it
        leaves the stored split and pins. With no other ready version of its model (a drain that
        was forced), only with `force` (409 `last_serving_version` otherwise): a draining version
        can still be rolled back to, a retired one must be loaded again.

        The wait for its requests in flight (a stream may run for minutes, or a client may stop
        reading) holds no lock: every other admin change, a rollback above all, goes on meanwhile.
        The retire itself then checks the state again under the lock.
        """
        record = _draining(await asyncio.to_thread(self.repo.get, name, version))
        self._check_retire(name, version, force)
        if self.fleet.get(record.id) is not None:
            await self.fleet.wait_drained(record.id)  # returns early if a rollback undrains it
        async with self._lock:
            record = _draining(await asyncio.to_thread(self.repo.get, name, version))
            self._check_retire(name, version, force)
            entry = self.fleet.get(record.id)
            result = None
            if entry is not None and entry.state is State.DRAINING:
                result = await self.fleet.retire(record.id)
            record = await asyncio.to_thread(self._set, record, State.RETIRED, None, actor)
            if entry is not None:
                entry.state = State.RETIRED
            plan = await asyncio.to_thread(self.repo.get_traffic, name)  # without the retired version
            self.fleet.set_plan(name, RoutePlan(plan.split, plan.pins))
            for hook in self.retire_hooks:
                await hook(record.id)
            status = self.status(record)
            return VersionStatus(**{**status.__dict__, "retire": result})

    async def rollback(self, name: str, to: str, actor: str) -> TrafficPlan:
        """All unpinned traffic back to `to` (ready again if it was draining); the others drain."""
        async with self._lock:
            target = self.fleet.get(f"{name}@{to}")
            if target is None or target.engine is None:
                raise ConflictError(
                    f"model {name!r} version {to!r} is not loaded; a rollback goes back to a loaded version",
                    param="to",
                    code="model_version_not_ready",
                )
            plan, drained = await asyncio.to_thread(self.repo.rollback, name, to, actor=actor)
            self.fleet.undrain(target.id)
            for version in drained:
                if self.fleet.get(f"{name}@{version}") is not None:
                    self.fleet.drain(f"{name}@{version}")
            self.fleet.set_plan(name, RoutePlan(plan.split, plan.pins))
            return plan

    # -- reading ----------------------------------------------------------------------------------

    async def list(self) -> tuple[list[VersionStatus], dict[str, TrafficPlan]]:
        records = await asyncio.to_thread(self.repo.list)
        plans = await asyncio.to_thread(self.repo.list_traffic)
        return [self.status(r) for r in records], plans

    def status(self, record: ModelVersionView) -> VersionStatus:
        entry = self.fleet.get(record.id)
        plan = self.fleet.plan(record.name)
        state, reason = record.state, record.failure_reason
        if entry is not None and entry.state is not State.REGISTERED:
            state, reason = entry.state, entry.failure_reason
        return VersionStatus(
            record=record,
            state=state,
            failure_reason=reason,
            traffic_percent=plan.split.get(record.version, 0),
            pinned_tenants=tuple(sorted(t for t, v in plan.pins.items() if v == record.version)),
            in_flight=entry.in_flight if entry is not None else 0,
            kv_usage=entry.kv_usage() if entry is not None else None,
        )

    # -- internals --------------------------------------------------------------------------------

    def _check_retire(self, name: str, version: str, force: bool) -> None:
        ready = [v.spec.version for v in self.fleet.routable(name)]
        check_keeps_serving(name, version, ready, "retire", force=force)

    async def _hold_current_traffic(self, name: str, actor: str) -> None:
        """Before a load: store the plan that routes `name` as it is routed now, if none does.

        Without a share for any ready version, the router sends everything to the version ready
        last: a version loaded now would take every request the moment it is ready. Storing the
        current choice (100% to the version serving now; the pins kept) makes the new version
        take nothing until an operator sets its share, and survives a restart.
        """
        plan = self.fleet.plan(name)
        serving = self.fleet.primary(name)
        if serving is None or any(plan.split.get(v.spec.version, 0) > 0 for v in self.fleet.routable(name)):
            return
        held = TrafficPlan(name=name, split={serving.spec.version: 100}, pins=dict(plan.pins))
        stored = await asyncio.to_thread(self.repo.set_traffic, held, actor=actor)
        self.fleet.set_plan(name, RoutePlan(stored.split, stored.pins))
        logger.info("%s: traffic held on %s while another version loads", name, serving.id)

    async def _load(self, record: ModelVersionView, actor: str, mark: bool = True) -> FleetVersion:
        if mark:
            record = await asyncio.to_thread(self._set, record, State.LOADING, None, actor)
        try:
            entry = await self.fleet.load(record.spec)
        except Exception as exc:
            # Never leave the record in `loading` (no edge leads out of it but ready or failed).
            await asyncio.to_thread(self._set, record, State.FAILED, f"{type(exc).__name__}: {exc}", actor)
            raise
        if entry.state is State.READY:
            await asyncio.to_thread(self._set, record, State.READY, None, actor)
        else:
            await asyncio.to_thread(self._set, record, State.FAILED, entry.failure_reason, actor)
        return entry

    def _set(
        self, record: ModelVersionView, state: ModelVersionState, reason: str | None, actor: str
    ) -> ModelVersionView:
        return self.repo.set_state(record.name, record.version, state, reason=reason, actor=actor)


def _loadable(record: ModelVersionView, entry: FleetVersion | None) -> None:
    """409 unless this server may load `record`'s version: the database's state (the transition
    table) and the fleet's (a version it serves, drains or loads now) must both allow it."""
    if entry is not None and entry.state in (State.READY, State.DRAINING, State.LOADING):
        raise ConflictError(
            f"model {record.name!r} version {record.version!r} is {entry.state.value} on this server "
            f"(recorded as {record.state.value}); it cannot be loaded",
            param="state",
            code="invalid_model_transition",
        )


def _draining(record: ModelVersionView) -> ModelVersionView:
    """`record`, if it may be retired (409 otherwise)."""
    if record.state is not State.DRAINING:
        raise ConflictError(
            f"model {record.name!r} version {record.version!r} is {record.state.value}; "
            "drain it before retiring it",
            param="state",
            code="invalid_model_transition",
        )
    return record
