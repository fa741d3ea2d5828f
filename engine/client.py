"""The contract between the gateway and the engine.

The gateway only ever talks to an `EngineClient`. The real one is `engine.async_engine.AsyncEngine`;
gateway tests use a fake that implements the same Protocol.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from engine.output import EngineStats, RequestOutput
from engine.request import Priority, SamplingParams


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
    model_version: str | None = None
    weight: float = 1.0  # the tenant's fair-share weight (QueuePolicy.FAIR); set by the server


@dataclass(frozen=True)
class EngineHealth:
    """Liveness and readiness of the engine."""

    alive: bool
    ready: bool
    detail: str = ""


@runtime_checkable
class EngineClient(Protocol):
    """What the gateway may ask of an engine."""

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Queue a request and stream its outputs; raises InvalidRequestError before queueing."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request at once and free its KV blocks. Unknown ids are ignored."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the engine's load."""
        ...

    def health(self) -> EngineHealth:
        """Whether the engine loop is alive and the model is loaded and warm."""
        ...
