"""LoRA adapter operations: each one applied to the records, the base version's engine and the catalog.

The records (`weir.tenancy.catalog.adapters.AdapterRepo`) are what survives a restart and what the audit log
sees; the engine of the adapter's base version holds its weights; the catalog
(`weir.gateway.fleet.adapter_catalog`) is what the OpenAI routes resolve `model` against. Each operation
checks the move against the records' one transition table first (409 otherwise), then acts on
the engine, then records the outcome:

- `load`: the engine reads and checks the folder (a refused adapter: the record goes `failed`
  with the reason and the caller gets the 400), its host copy is reserved in the memory budget,
  then the record goes `loaded` and the catalog takes it.
- `unload`: the catalog drops it first (new requests get the unknown-model 404), the requests
  already through it finish (streams are never cut), then the engine forgets it, its budget goes
  back and the record goes `unloaded`.
- `retire`: unload if loaded, then `retired` for good.
- `grant` / `revoke`: the access list; the catalog's copy follows at once.
- `version_retired`: the base version was retired (its engine and the adapters on it are gone);
  its adapters leave the catalog. Their records went `unloaded` with the version's own move
  (`weir.tenancy.catalog.model_versions`), audited, so a restart does not try to load them again.

At start-up `start` loads every adapter recorded as `loaded` onto its base version's engine
(after the versions themselves were restored); one that cannot load goes `failed` with the
reason, and the server starts without it.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections import defaultdict
from dataclasses import dataclass

from weir.engine.client import AdapterControl
from weir.engine.kv.memory_budget import MemoryBudgetError, adapter_owner
from weir.engine.lora.lora_types import AdapterInfo, AdapterInUseError, AdapterLoadError, UnknownAdapterError
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.fleet.model_fleet import ModelFleet
from weir.gateway.fleet.model_rollout import STARTUP_ACTOR
from weir.gateway.http.errors import ConflictError
from weir.tenancy.catalog.adapter_records import ADAPTER_TRANSITIONS, AdapterSpec, AdapterView
from weir.tenancy.catalog.adapters import AdapterRepo
from weir.tenancy.errors import InvalidAdapterTransitionError
from weir.tenancy.store.enums import AdapterState, ModelVersionState

logger = logging.getLogger("weir.adapters")

_UNLOAD_POLL_S = 0.02


@dataclass(frozen=True)
class AdapterStatus:
    """An adapter's record with what only the running server knows."""

    record: AdapterView
    serving: bool  # in the catalog: requests naming it are routed to its base version
    in_flight: int  # requests through it that have not settled
    engine: AdapterInfo | None  # the base engine's view (rank, bytes, slot, counters); None: not held


def _check(view: AdapterView, new: AdapterState) -> None:
    if new not in ADAPTER_TRANSITIONS[view.state]:
        allowed = sorted(s.value for s in ADAPTER_TRANSITIONS[view.state])
        raise InvalidAdapterTransitionError(view.name, view.state.value, new.value, allowed)


class AdapterRollout:
    """The admin operations on LoRA adapters (see the module docstring)."""

    def __init__(self, fleet: ModelFleet, repo: AdapterRepo, catalog: AdapterCatalog) -> None:
        self.fleet = fleet
        self.repo = repo
        self.catalog = catalog
        # One change at a time per adapter; an unload waiting for its streams holds up no other.
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    # -- start-up ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every adapter recorded as loaded onto its base version's engine."""
        for view in await asyncio.to_thread(self.repo.list, None, AdapterState.LOADED):
            try:
                info = await self._engine_load(view)
            except Exception as exc:
                reason = f"could not load at start-up: {exc}"
                logger.error("adapter %s: %s", view.name, reason)
                await asyncio.to_thread(
                    self.repo.set_state, view.name, AdapterState.FAILED, reason=reason, actor=STARTUP_ACTOR
                )
                continue
            self.catalog.put(view)
            logger.info(
                "adapter %s is loaded on %s (%d bytes)", view.name, view.model_version, info.num_bytes
            )

    # -- reading ----------------------------------------------------------------------------------

    def status(self, view: AdapterView) -> AdapterStatus:
        entry = self.fleet.get(view.model_version)
        held: AdapterInfo | None = None
        if entry is not None and entry.engine is not None:
            try:
                held = next((a for a in entry.engine.stats().adapters if a.name == view.name), None)
            except Exception:
                held = None
        return AdapterStatus(
            view,
            serving=self.catalog.has(view.name),
            in_flight=self.fleet.adapter_in_flight(view.model_version, view.name),
            engine=held,
        )

    async def list(self, model_version: str | None = None) -> builtins.list[AdapterStatus]:
        views = await asyncio.to_thread(self.repo.list, model_version)
        return [self.status(v) for v in views]

    async def get(self, name: str) -> AdapterStatus:
        return self.status(await asyncio.to_thread(self.repo.get, name))

    # -- operations -------------------------------------------------------------------------------

    async def register(self, spec: AdapterSpec, actor: str) -> AdapterStatus:
        return self.status(await asyncio.to_thread(self.repo.register, spec, actor=actor))

    async def load(self, name: str, actor: str) -> AdapterStatus:
        """Load onto the base version's engine; a refused adapter leaves the record failed."""
        async with self._locks[name]:
            view = await asyncio.to_thread(self.repo.get, name)
            _check(view, AdapterState.LOADED)
            try:
                await self._engine_load(view)
            except (AdapterLoadError, MemoryBudgetError) as exc:
                await asyncio.to_thread(
                    self.repo.set_state, name, AdapterState.FAILED, reason=str(exc), actor=actor
                )
                raise
            try:
                view = await asyncio.to_thread(self.repo.set_state, name, AdapterState.LOADED, actor=actor)
            except BaseException:
                await self._engine_unload(view)
                raise
            self.catalog.put(view)
            return self.status(view)

    async def unload(self, name: str, actor: str) -> AdapterStatus:
        """Stop routing to it, let its requests finish, then free it on the engine."""
        async with self._locks[name]:
            view = await asyncio.to_thread(self.repo.get, name)
            _check(view, AdapterState.UNLOADED)
            await self._drain_and_unload(view)
            return self.status(
                await asyncio.to_thread(self.repo.set_state, name, AdapterState.UNLOADED, actor=actor)
            )

    async def retire(self, name: str, actor: str) -> AdapterStatus:
        """Unload if loaded, then never load again (the record stays: usage records name it)."""
        async with self._locks[name]:
            view = await asyncio.to_thread(self.repo.get, name)
            if view.state is AdapterState.LOADED:
                await self._drain_and_unload(view)
                view = await asyncio.to_thread(self.repo.set_state, name, AdapterState.UNLOADED, actor=actor)
            _check(view, AdapterState.RETIRED)
            return self.status(
                await asyncio.to_thread(self.repo.set_state, name, AdapterState.RETIRED, actor=actor)
            )

    async def grant(self, name: str, tenant: str, actor: str) -> AdapterStatus:
        return self._refresh(await asyncio.to_thread(self.repo.grant, name, tenant, actor=actor))

    async def revoke(self, name: str, tenant: str, actor: str) -> AdapterStatus:
        return self._refresh(await asyncio.to_thread(self.repo.revoke, name, tenant, actor=actor))

    async def version_retired(self, model_version: str) -> None:
        """`model_version` was retired: its adapters stop resolving and their budget goes back
        (the records moved with the version's; see the module docstring)."""
        for name in self.catalog.remove_version(model_version):
            if self.fleet.budget is not None:
                self.fleet.budget.release(adapter_owner(model_version, name))
            logger.info("adapter %s is unloaded: its base version %s was retired", name, model_version)

    # -- helpers ----------------------------------------------------------------------------------

    def _refresh(self, view: AdapterView) -> AdapterStatus:
        """A changed access list applies to new requests at once."""
        if self.catalog.has(view.name):
            self.catalog.put(view)
        return self.status(view)

    def _control(self, view: AdapterView) -> AdapterControl:
        entry = self.fleet.get(view.model_version)
        if entry is None or entry.state is not ModelVersionState.READY or entry.engine is None:
            state = "not loaded" if entry is None else entry.state.value
            raise ConflictError(
                f"adapter {view.name!r} needs its base model version {view.model_version!r} ready; it is {state}",
                param="model_version",
                code="model_version_not_ready",
            )
        if not hasattr(entry.engine, "load_adapter"):
            raise ConflictError(
                f"the engine of {view.model_version!r} cannot load LoRA adapters",
                param="model_version",
                code="lora_unsupported",
            )
        control: AdapterControl = entry.engine  # type: ignore[assignment]
        return control

    async def _engine_load(self, view: AdapterView) -> AdapterInfo:
        """Load on the engine and reserve its host copy in the budget (undone if that fails)."""
        control = self._control(view)
        info = await control.load_adapter(view.name, view.path)
        budget = self.fleet.budget
        if budget is not None:
            owner = adapter_owner(view.model_version, view.name)
            budget.release(owner)  # a reload of the same name replaces what it held
            try:
                budget.reserve(owner, info.num_bytes, what=f"adapter {view.name!r}: {info.num_bytes} bytes")
            except MemoryBudgetError:
                await control.unload_adapter(view.name)
                raise
        return info

    async def _engine_unload(self, view: AdapterView) -> None:
        entry = self.fleet.get(view.model_version)
        if entry is not None and entry.engine is not None and hasattr(entry.engine, "unload_adapter"):
            control: AdapterControl = entry.engine  # type: ignore[assignment]
            while True:
                try:
                    await control.unload_adapter(view.name)
                    break
                except UnknownAdapterError:
                    break  # not held (its base was reloaded, or it failed at load)
                except AdapterInUseError:
                    # A request the gateway has let go of is still leaving the engine's queue.
                    await asyncio.sleep(_UNLOAD_POLL_S)
        if self.fleet.budget is not None:
            self.fleet.budget.release(adapter_owner(view.model_version, view.name))

    async def _drain_and_unload(self, view: AdapterView) -> None:
        self.catalog.remove(view.name)  # new requests naming it: the unknown-model 404
        while self.fleet.adapter_in_flight(view.model_version, view.name) > 0:
            await asyncio.sleep(_UNLOAD_POLL_S)
        await self._engine_unload(view)
