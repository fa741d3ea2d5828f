"""The contract between the gateway and the engine.

The gateway only ever talks to an `EngineClient`. The real one is `weir.engine.async_engine.AsyncEngine`;
gateway tests use a fake that implements the same Protocol.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from weir.engine.engine_stats import EngineStats
from weir.engine.kv.prefix_cache_types import FlushResult, PrefixCacheStats, SharedPrefixInfo
from weir.engine.latency_targets import NO_TARGETS, LatencyTargets
from weir.engine.lora.lora_types import AdapterInfo, AdapterRef
from weir.engine.output import RequestOutput
from weir.engine.request import Priority, Request, SamplingParams, TokenChecker
from weir.engine.structured.call_closing import new_matcher
from weir.engine.structured.constraints import CompiledConstraint


@dataclass(frozen=True)
class EngineRequest:
    """A validated, tokenized request, ready for the engine queue."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    tenant_id: str = "default"
    priority: Priority = Priority.STANDARD
    cache_scope: str = "default"  # set by the server from the API key, never by the client
    arrival_s: float = field(default_factory=time.monotonic)
    deadline_s: float | None = None  # monotonic time after which a still-waiting request is aborted
    weight: float = 1.0  # the tenant's fair-share weight (QueuePolicy.FAIR); set by the server
    # The tenant's TTFT/ITL objectives (quota ttft_slo_ms / tpot_slo_ms); None fields: the class
    # defaults the engine resolves (engine/latency_targets.py). Set by the server.
    latency: LatencyTargets = NO_TARGETS
    # The client gave no max_tokens (it was filled in from the context left): admission reserves
    # a bounded default instead of all of it, and settles on what is used.
    max_tokens_defaulted: bool = False
    # A grammar compiled by the gateway (structured outputs, tool calls): each sequence of the
    # request gets its own matcher of it. Immutable, so it crosses the thread boundary as is.
    constraint: CompiledConstraint | None = field(default=None, compare=False)
    # The LoRA adapter to run through (the gateway resolves `model` to it); None: the base model.
    adapter_name: str | None = None
    # Filled in by the engine when it accepts the request: the adapter's weights digest.
    adapter_fingerprint: str = ""

    def to_request(
        self,
        request_id: str,
        sampling_params: SamplingParams,
        index: int = 0,
        checker: TokenChecker | None = None,
    ) -> Request:
        """One engine-side sequence of this request (a choice, or a beam group's first beam)."""
        return Request(
            request_id=request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            sampling_params=sampling_params,
            tenant_id=self.tenant_id,
            priority=self.priority,
            cache_scope=self.cache_scope,
            arrival_s=self.arrival_s,
            deadline_s=self.deadline_s,
            weight=self.weight,
            latency=self.latency,
            adapter=AdapterRef(self.adapter_name, self.adapter_fingerprint) if self.adapter_name else None,
            parent_id=self.request_id,
            index=index,
            checker=checker,
            constraint=(
                new_matcher(self.constraint, sampling_params.max_tokens)
                if self.constraint is not None
                else None
            ),
        )


@dataclass(frozen=True)
class EngineHealth:
    """Liveness and readiness of the engine."""

    alive: bool
    ready: bool
    detail: str = ""


class EngineClient(Protocol):
    """What the gateway may ask of an engine."""

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Queue a request and stream its outputs; an invalid request raises InvalidRequestError
        before any output. Closing the stream early aborts the request unless `abort` already did."""
        ...

    async def abort(self, request_id: str) -> int | None:
        """Stop a request at once and free its KV blocks. Unknown ids are ignored.

        Returns the prompt tokens computed for it before the abort (billed: the work was done),
        or None when the engine does not know (the request had ended, or was never here)."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the engine's load."""
        ...

    def health(self) -> EngineHealth:
        """Whether the engine loop is alive and the model is loaded and warm."""
        ...


class AdapterControl(Protocol):
    """What the admin API may ask of an engine's LoRA adapters (`AsyncEngine` has it).

    Separate from `EngineClient`: engines without LoRA and gateway fakes need not have it.
    `load_adapter` raises `AdapterLoadError` for an adapter that must not be loaded;
    `unload_adapter` raises `AdapterInUseError` while a request through it is queued or running,
    `UnknownAdapterError` for a name it does not hold.
    """

    async def load_adapter(self, name: str, path: str) -> AdapterInfo: ...

    async def unload_adapter(self, name: str) -> AdapterInfo: ...


class PrefixCacheControl(Protocol):
    """What the admin API may ask of an engine's prefix cache, as one object (`AsyncEngine.prefix_cache`).

    Separate from `EngineClient`: engines without a prefix cache (and gateway fakes) need not
    have one. Unknown prefix ids raise `UnknownPrefixError`; a prefix the engine cannot take
    `InvalidPrefixError` (`PinCapacityError` past the pin budget); see `weir.engine.kv.prefix_cache_types`.
    """

    async def stats(self) -> PrefixCacheStats:
        """Fresh stats: totals, per tenant (hit rate, cached tokens, evictions), per scope."""
        ...

    def snapshot(self) -> PrefixCacheStats:
        """Recent stats without waiting on the engine (for metrics scrapes)."""
        ...

    async def register(self, token_ids: Sequence[int], name: str = "", pin: bool = False) -> SharedPrefixInfo:
        """Register a prefix in the shared scope and compute its blocks."""
        ...

    async def list_prefixes(self) -> tuple[SharedPrefixInfo, ...]: ...

    async def get(self, prefix_id: str) -> SharedPrefixInfo: ...

    async def pin(self, prefix_id: str) -> SharedPrefixInfo: ...

    async def unpin(self, prefix_id: str) -> SharedPrefixInfo: ...

    async def unregister(self, prefix_id: str) -> SharedPrefixInfo: ...

    async def flush(
        self,
        model_version: str | None = None,
        tenant_id: str | None = None,
        cache_scope: str | None = None,
        include_pinned: bool = False,
    ) -> FlushResult:
        """Forget cached blocks of a model version, a tenant or a scope (all when none given)."""
        ...
