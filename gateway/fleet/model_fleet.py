"""The engines one server runs side by side: one per loaded model version, with its state.

`ModelFleet` maps a version id (`name@version`) to its engine and is what the OpenAI routes,
admission, metrics and health read instead of one engine:

- `route(name, tenant, request_id)` picks the version of a new request (`weir.gateway.fleet.traffic_router`:
  pin, then weighted split, over the ready versions only) and hands out a `Lease` that counts the
  request in flight on that version until the response has settled; the request keeps that
  version's engine, tokenizer and limits for its whole life.
- `load(spec)` reserves the version's footprint in the process-wide `MemoryBudget` (refused with
  the numbers if it does not fit), builds the engine in a worker thread and starts it with a
  warm-up generation: only then is it `ready`. Any failure leaves it `failed` with the reason,
  gives its reservation back and changes nothing else.
- `drain(id)`: no new requests; in-flight ones finish on it. `retire(id)` waits for them, flushes
  its prefix cache, stops the engine, drops every reference to it (weights, KV pool) and gives
  its reservation back; the memory actually freed is measured with the injected probe.

Engines run on their own threads, so one crashing (its loop restarts, or dies) fails only its own
requests. The fleet keeps the runtime truth; `weir.gateway.fleet.model_rollout` persists it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from weir.engine.client import EngineClient, EngineHealth
from weir.engine.engine_stats import DESCRIBES_ENGINE, EngineStats
from weir.engine.kv.memory_budget import MemoryBudget
from weir.gateway.fleet.fleet_types import EngineFactory, ManagedEngine, ServedModel, model_fingerprint
from weir.gateway.fleet.traffic_router import RoutePlan, choose_version
from weir.gateway.http.errors import ServiceUnavailableError
from weir.gateway.prompts.tokenization import PromptBuilder, Tokenizer
from weir.tenancy.catalog.model_version_records import ModelVersionSpec, version_id
from weir.tenancy.store.enums import ModelVersionState

logger = logging.getLogger("weir.fleet")

State = ModelVersionState
_RETIRE_POLL_S = 0.02


@dataclass
class FleetVersion:
    """One model version in this process: its state and, while loaded, its engine."""

    spec: ModelVersionSpec
    state: State = State.REGISTERED
    failure_reason: str | None = None
    engine: EngineClient | None = None
    tokenizer: Tokenizer | None = None
    prompts: PromptBuilder | None = None
    served: ServedModel | None = None
    in_flight: int = 0
    adapter_in_flight: dict[str, int] = field(default_factory=dict)  # by LoRA adapter name
    ready_seq: int = 0  # order in which versions became ready (the router's fallback)
    reserved_bytes: int = 0

    @property
    def id(self) -> str:
        return self.spec.id

    def kv_usage(self) -> float | None:
        """Share of its KV blocks in use; None when not loaded."""
        if self.engine is None:
            return None
        try:
            return self.engine.stats().kv_usage
        except Exception:
            return None


@dataclass
class Lease:
    """A request's hold on the version that serves it; `release()` once it has settled."""

    version: FleetVersion
    adapter: str | None = None  # the LoRA adapter it runs through, counted in flight too
    _released: bool = field(default=False, repr=False)

    @property
    def engine(self) -> EngineClient:
        assert self.version.engine is not None  # routed versions are loaded; retire waits for leases
        return self.version.engine

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.version.in_flight -= 1
            if self.adapter is not None:
                counts = self.version.adapter_in_flight
                counts[self.adapter] -= 1
                if counts[self.adapter] == 0:
                    del counts[self.adapter]


@dataclass(frozen=True)
class RetireResult:
    """What a retire gave back: the budget released and the memory measured before and after."""

    released_budget_bytes: int
    memory_before_bytes: int | None
    memory_after_bytes: int | None

    @property
    def freed_bytes(self) -> int | None:
        if self.memory_before_bytes is None or self.memory_after_bytes is None:
            return None
        return self.memory_before_bytes - self.memory_after_bytes


class NoModelVersionError(ServiceUnavailableError):
    """No version of the requested model may take new requests right now."""

    default_code = "model_version_unavailable"


# How long a client is told to wait when a known model has no ready version (an operator drained
# or retired its last one with force, or its next version is loading).
MODEL_UNAVAILABLE_RETRY_AFTER_S = 30


class ModelUnavailableError(ServiceUnavailableError):
    """The model exists on this server but no version of it is ready: 503 with Retry-After,
    never the 404 an SDK reads as "this model does not exist"."""

    default_code = "model_unavailable"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"The model '{name}' is temporarily unavailable: no version of it is ready; retry later",
            param="model",
            headers={"Retry-After": str(MODEL_UNAVAILABLE_RETRY_AFTER_S)},
        )


def _alive(engine: EngineClient | None) -> bool:
    if engine is None:
        return False
    try:
        return engine.health().alive
    except Exception:
        return False


class ModelFleet:
    """Every model version of this server and the engine of each loaded one (see the module doc)."""

    def __init__(
        self,
        factory: EngineFactory | None = None,
        budget: MemoryBudget | None = None,
        memory_probe: Callable[[], int | None] | None = None,
        release_memory: Callable[[], None] | None = None,
        tokenizer_copies: int = 0,
    ) -> None:
        self.factory = factory
        # Private tokenizer copies a loaded version's PromptBuilder makes on the loading thread
        # (one per tokenizer pool worker), not on its first busy moment while serving.
        self.tokenizer_copies = tokenizer_copies
        self.budget = budget
        self._probe = memory_probe or (lambda: None)
        self._release_memory = release_memory or (lambda: None)
        self._versions: dict[str, FleetVersion] = {}
        self._plans: dict[str, RoutePlan] = {}
        self._ready_count = 0
        # Engines are built on one thread that lives as long as the fleet. Measured: an engine
        # whose weights were loaded (and packed for the CPU) on a thread that has since exited
        # decodes ~10x slower (asyncio.to_thread's threads end with their loop, and start-up runs
        # on a short-lived loop), so loads never use a loop's default executor.
        self._builder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weir-load")

    # -- reading ---------------------------------------------------------------------------------

    def get(self, vid: str) -> FleetVersion | None:
        return self._versions.get(vid)

    def versions(self) -> list[FleetVersion]:
        return list(self._versions.values())

    def plan(self, name: str) -> RoutePlan:
        return self._plans.get(name, RoutePlan())

    def routable(self, name: str) -> list[FleetVersion]:
        """The versions of `name` that take new requests, in the order they became ready."""
        ready = [v for v in self._versions.values() if v.spec.name == name and v.state is State.READY]
        return sorted(ready, key=lambda v: v.ready_seq)

    def served_models(self, tenant_id: str | None = None) -> list[ServedModel]:
        """One entry per model name with a ready version: the card of the version that serves
        `tenant_id` (see `serving`), never that of a version pinned to another tenant."""
        names = sorted({v.spec.name for v in self._versions.values() if v.state is State.READY})
        chosen = (self.serving(n, tenant_id) for n in names)
        return [v.served for v in chosen if v is not None and v.served is not None]

    def serving(self, name: str, tenant_id: str | None = None) -> FleetVersion | None:
        """The version `tenant_id`'s requests of `name` go to: its pin while that version is
        ready, else the one most of the unpinned traffic goes to (`primary`)."""
        pinned = self.plan(name).pins.get(tenant_id) if tenant_id is not None else None
        if pinned is not None:
            entry = self._versions.get(version_id(name, pinned))
            if entry is not None and entry.state is State.READY:
                return entry
        return self.primary(name)

    def serves(self, name: str) -> bool:
        return bool(self.routable(name))

    def knows(self, name: str) -> bool:
        """Whether `name` is served, was served or is about to be: some version of it is loading,
        ready, draining or retired. Such a model with no ready version is unavailable for a while,
        not unknown; one only registered (or whose only loads failed) was never served."""
        served = (State.LOADING, State.READY, State.DRAINING, State.RETIRED)
        return any(v.spec.name == name and v.state in served for v in self._versions.values())

    def primary(self, name: str | None = None) -> FleetVersion | None:
        """The version most of `name`'s unpinned traffic goes to (any name's if None)."""
        names = [name] if name is not None else sorted({v.spec.name for v in self._versions.values()})
        for n in names:
            ready = self.routable(n)
            if ready:
                plan = self.plan(n)
                return max(reversed(ready), key=lambda v: plan.split.get(v.spec.version, 0))
        return None

    def loaded(self) -> list[FleetVersion]:
        return [v for v in self._versions.values() if v.engine is not None]

    def stats_by_version(self) -> dict[str, EngineStats]:
        """Each loaded engine's load snapshot, by version id."""
        out: dict[str, EngineStats] = {}
        for v in self.loaded():
            assert v.engine is not None
            out[v.id] = v.engine.stats()
        return out

    def stats(self) -> EngineStats:
        """The load of every engine together (admission bounds the server's queue as a whole).

        One engine: its own snapshot, unchanged. Several: counts and rates summed, since their
        steps run concurrently on separate threads.
        """
        snapshots = list(self.stats_by_version().values())
        if len(snapshots) == 1:
            return snapshots[0]
        if not snapshots:
            return EngineStats(
                num_running=0, num_waiting=0, num_total_blocks=0, num_free_blocks=0, block_size=16
            )
        values: dict[str, Any] = {}
        for f in fields(EngineStats):
            column = [getattr(s, f.name) for s in snapshots]
            first = column[0]
            if f.name == "adapters":  # each engine's own adapters, side by side
                values[f.name] = tuple(a for c in column for a in c)
            elif (
                f.metadata.get(DESCRIBES_ENGINE, False)
                or not isinstance(first, int | float | tuple)
                or isinstance(first, bool)
            ):
                values[f.name] = first  # a description of one engine (e.g. its step budget), not a count
            elif isinstance(first, tuple):
                values[f.name] = tuple(sum(c) for c in zip(*column, strict=True))
            else:
                values[f.name] = sum(column)
        return EngineStats(**values)

    def health(self) -> EngineHealth:
        """Alive and ready while some ready version's engine is; details name the others."""
        healths = {
            v.id: v.engine.health() for v in self.loaded() if v.engine is not None and v.state is State.READY
        }
        if not healths:
            return EngineHealth(alive=False, ready=False, detail="no model version is ready")
        if len(healths) == 1:
            return next(iter(healths.values()))
        alive = any(h.alive for h in healths.values())
        ready = any(h.ready for h in healths.values())
        detail = "; ".join(f"{vid}: {h.detail}" for vid, h in healths.items() if h.detail)
        return EngineHealth(alive=alive, ready=ready, detail=detail)

    # -- routing ---------------------------------------------------------------------------------

    def route(self, name: str, tenant_id: str, request_id: str) -> Lease:
        """The version that serves a new request of model `name`, counted in flight."""
        # A version whose engine died (its loop gave up restarting) takes none while another lives:
        # its crash stays its own and the others serve its share. With none alive, the engine's own
        # error answers (503 engine_unavailable), as with one engine.
        ready = [v for v in self.routable(name) if _alive(v.engine)] or self.routable(name)
        label = choose_version(self.plan(name), [v.spec.version for v in ready], tenant_id, request_id)
        chosen = next((v for v in ready if v.spec.version == label), None)
        if chosen is None or chosen.engine is None:
            raise NoModelVersionError(f"no version of the model '{name}' is ready", param="model")
        chosen.in_flight += 1
        return Lease(chosen)

    def route_version(self, vid: str, adapter: str | None = None) -> Lease:
        """A new request for exactly version `vid` (a LoRA adapter's base), counted in flight,
        and in `adapter`'s count too (an unload waits for it to reach 0)."""
        entry = self._versions.get(vid)
        if entry is None or entry.state is not State.READY or entry.engine is None:
            raise NoModelVersionError(f"the model version '{vid}' is not ready", param="model")
        entry.in_flight += 1
        if adapter is not None:
            entry.adapter_in_flight[adapter] = entry.adapter_in_flight.get(adapter, 0) + 1
        return Lease(entry, adapter)

    def adapter_in_flight(self, vid: str, adapter: str) -> int:
        """Requests through `adapter` on version `vid` that have not settled."""
        entry = self._versions.get(vid)
        return 0 if entry is None else entry.adapter_in_flight.get(adapter, 0)

    def set_plan(self, name: str, plan: RoutePlan) -> None:
        """Replace `name`'s split and pins (new requests follow it at once; running ones stay put)."""
        self._plans[name] = plan

    # -- lifecycle -------------------------------------------------------------------------------

    def add_ready(
        self,
        spec: ModelVersionSpec,
        engine: EngineClient,
        tokenizer: Tokenizer,
        *,
        max_model_len: int,
        vocab_size: int | None = None,
        fingerprint: str | None = None,
    ) -> FleetVersion:
        """Add an engine someone else starts and stops (an app built around one engine)."""
        entry = self._versions.setdefault(spec.id, FleetVersion(spec))
        self._attach(entry, engine, tokenizer, max_model_len, vocab_size, fingerprint)
        return entry

    def register(self, spec: ModelVersionSpec) -> FleetVersion:
        """Know a version (state as given by the caller's records; registered if new)."""
        return self._versions.setdefault(spec.id, FleetVersion(spec))

    def forget(self, vid: str) -> None:
        self._versions.pop(vid, None)

    async def load(self, spec: ModelVersionSpec) -> FleetVersion:
        """Reserve, build, start with a warm-up; `ready` on success, else `failed` with the reason."""
        entry = self.register(spec)
        if entry.state in (State.READY, State.DRAINING, State.LOADING):
            raise ValueError(f"model version {spec.id} is {entry.state.value}; it cannot be loaded")
        if self.factory is None or self.budget is None:
            entry.state, entry.failure_reason = State.FAILED, "this server cannot load model versions"
            return entry
        entry.state, entry.failure_reason = State.LOADING, None
        engine: ManagedEngine | None = None
        try:
            loop = asyncio.get_running_loop()
            footprint = await loop.run_in_executor(self._builder, self.factory.footprint, spec)
            self.budget.reserve(spec.id, footprint.num_bytes, what=footprint.describe())
            entry.reserved_bytes = footprint.num_bytes
            built = await loop.run_in_executor(self._builder, self.factory.build, spec, footprint, spec.id)
            engine = built.engine
            prompts = PromptBuilder(built.tokenizer, built.vocab_size)
            await loop.run_in_executor(self._builder, prompts.make_copies, self.tokenizer_copies)
            await engine.start(warmup=True)  # ready only after a warm-up generation succeeded
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}" if not str(exc).startswith(spec.id) else str(exc)
            logger.warning("loading %s failed: %s", spec.id, reason)
            if engine is not None:
                try:
                    await engine.shutdown()
                except Exception:
                    logger.exception("stopping the failed engine of %s failed", spec.id)
            engine = None
            self.budget.release(spec.id)
            entry.reserved_bytes = 0
            entry.state, entry.failure_reason = State.FAILED, reason
            self._release_memory()
            return entry
        self._attach(entry, engine, built.tokenizer, built.max_model_len, built.vocab_size, None, prompts)
        logger.info("model version %s is ready (%s)", spec.id, footprint.describe())
        return entry

    def drain(self, vid: str) -> FleetVersion:
        """No new requests for `vid`; those in flight finish on it."""
        entry = self._need(vid)
        if entry.state is State.READY:
            entry.state = State.DRAINING
        return entry

    def undrain(self, vid: str) -> FleetVersion:
        """A draining version takes new requests again (rollback)."""
        entry = self._need(vid)
        if entry.state is State.DRAINING and entry.engine is not None:
            entry.state = State.READY
            self._ready_count += 1
            entry.ready_seq = self._ready_count
        return entry

    async def wait_drained(self, vid: str, timeout_s: float | None = None) -> bool:
        """Wait until no request is in flight on draining `vid`; False on timeout, or as soon as
        it is no longer draining (a rollback made it ready again: its requests need not end)."""
        entry = self._need(vid)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while entry.in_flight > 0:
            if entry.state is not State.DRAINING:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_RETIRE_POLL_S)
        return True

    async def retire(self, vid: str) -> RetireResult:
        """After its drain completes: flush its cached blocks, stop its engine, free its memory."""
        entry = self._need(vid)
        if entry.state is not State.DRAINING or not await self.wait_drained(vid):
            raise ValueError(f"model version {vid} is {entry.state.value}; drain it before retiring it")
        before = self._probe()
        engine, entry.engine, entry.prompts, entry.served = entry.engine, None, None, None
        entry.tokenizer = None
        if engine is not None:
            control = getattr(engine, "prefix_cache", None)
            if control is not None:
                try:
                    await control.flush(include_pinned=True)
                except Exception:
                    logger.exception("flushing the prefix cache of %s failed", vid)
            stop = getattr(engine, "shutdown", None)
            if stop is not None:
                await stop()
        del engine
        gc.collect()
        self._release_memory()
        released = 0
        if self.budget is not None:
            released = self.budget.release(vid)
            for held in self.budget.reservations():
                if held.owner.startswith(f"{vid}#"):  # its LoRA adapters' host copies went with it
                    released += self.budget.release(held.owner)
        entry.reserved_bytes = 0
        entry.state = State.RETIRED
        after = self._probe()
        result = RetireResult(released, before, after)
        logger.info(
            "retired %s: budget released %d bytes, memory freed %s", vid, released, result.freed_bytes
        )
        return result

    async def shutdown(self) -> None:
        """Stop every engine the fleet started (server shutdown)."""
        for entry in self.loaded():
            stop = getattr(entry.engine, "shutdown", None)
            if stop is not None and entry.state is not State.REGISTERED:
                try:
                    await stop()
                except Exception:
                    logger.exception("stopping %s failed", entry.id)
        self._builder.shutdown(wait=False)

    def _need(self, vid: str) -> FleetVersion:
        entry = self._versions.get(vid)
        if entry is None:
            raise KeyError(vid)
        return entry

    def _attach(
        self,
        entry: FleetVersion,
        engine: EngineClient,
        tokenizer: Tokenizer,
        max_model_len: int,
        vocab_size: int | None,
        fingerprint: str | None,
        prompts: PromptBuilder | None = None,
    ) -> None:
        name = entry.spec.name
        entry.engine = engine
        entry.tokenizer = tokenizer
        entry.prompts = prompts if prompts is not None else PromptBuilder(tokenizer, vocab_size)
        entry.served = ServedModel(
            name,
            max_model_len,
            created=int(time.time()),
            fingerprint=fingerprint or model_fingerprint(name, max_model_len, entry.id),
        )
        entry.state, entry.failure_reason = State.READY, None
        self._ready_count += 1
        entry.ready_seq = self._ready_count


def single_engine_fleet(
    name: str,
    engine: EngineClient,
    tokenizer: Tokenizer,
    *,
    max_model_len: int,
    vocab_size: int | None,
    fingerprint: str,
    version: str = "default",
) -> ModelFleet:
    """A fleet of one ready engine that its owner starts and stops (what `create_app(engine)` serves)."""
    fleet = ModelFleet()
    spec = ModelVersionSpec(name=name, version=version, path="(in process)")
    fleet.add_ready(
        spec, engine, tokenizer, max_model_len=max_model_len, vocab_size=vocab_size, fingerprint=fingerprint
    )
    return fleet
