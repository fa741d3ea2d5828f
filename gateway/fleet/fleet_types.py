"""What the fleet of model versions is made of, apart from the fleet itself: the served model as
clients see it, and the contract of the engine factory that loads versions (the real one is
`weir.gateway.fleet.version_engines.VersionEngineFactory`; fleet tests pass their own).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from weir.engine.client import EngineClient
from weir.engine.kv.memory_budget import VersionFootprint
from weir.gateway.prompts.tokenization import Tokenizer
from weir.tenancy.catalog.model_version_records import ModelVersionSpec


def model_fingerprint(name: str, max_model_len: int, extra: str = "") -> str:
    """A `system_fingerprint` that changes when the served model or its configuration does."""
    digest = hashlib.sha256(f"{name}|{max_model_len}|{extra}".encode()).hexdigest()
    return f"fp_{digest[:10]}"


@dataclass(frozen=True)
class ServedModel:
    """A model name as clients see it (the version that serves a request is in its header)."""

    name: str
    max_model_len: int
    created: int  # epoch seconds, for /v1/models
    fingerprint: str  # system_fingerprint: changes when the served weights or config change

    def card(self) -> dict[str, object]:
        """The /v1/models entry."""
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "weir",
            "max_model_len": self.max_model_len,
        }


class ManagedEngine(EngineClient, Protocol):
    """An engine the fleet can start (with a warm-up generation) and stop."""

    async def start(self, warmup: bool = True) -> None: ...

    async def shutdown(self) -> None: ...


@dataclass
class BuiltEngine:
    """What the engine factory returns for a version: a not yet started engine and its tokenizer."""

    engine: ManagedEngine
    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int


class EngineFactory(Protocol):
    """Builds engines for model versions (blocking: reads weights; the fleet calls it in a thread)."""

    def footprint(self, spec: ModelVersionSpec) -> VersionFootprint:
        """The memory the version will need, from its config alone (no weights read)."""
        ...

    def build(self, spec: ModelVersionSpec, footprint: VersionFootprint, model_version: str) -> BuiltEngine:
        """Load the weights and allocate the KV pool of `footprint`; `model_version` keys its cache."""
        ...
