"""Torch-free LoRA types and errors the scheduler, the KV manager and the gateway share."""

from __future__ import annotations

from dataclasses import dataclass

from weir.engine.errors import EngineError, InvalidRequestError


class AdapterLoadError(EngineError, ValueError):
    """An adapter folder that must not be loaded: outside the adapter directory, malformed,
    for another base model, over the rank limit, or with non-finite weights."""


class UnknownAdapterError(InvalidRequestError):
    """A request names an adapter this engine has not loaded (param `model`)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"adapter {name!r} is not loaded", "model")
        self.name = name


class AdapterInUseError(EngineError):
    """An adapter cannot be unloaded while requests through it are queued or running."""


@dataclass(frozen=True)
class AdapterRef:
    """The adapter a request runs through: its name and the digest of its weights.

    `cache_key` goes into the prefix-cache root (engine/kv/block_hash.py): KV computed through one
    adapter is never found by a request through another, nor through other weights under the
    same name.
    """

    name: str
    fingerprint: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")

    @property
    def cache_key(self) -> str:
        return f"{self.name}@{self.fingerprint}"


@dataclass(frozen=True)
class AdapterInfo:
    """One loaded adapter as the engine reports it (admin API, metrics)."""

    name: str
    path: str
    rank: int
    target_modules: tuple[str, ...]
    fingerprint: str
    num_bytes: int
    slot: int | None  # the device slot holding it now; None: in host memory only
    num_requests: int
    num_tokens: int  # tokens computed through it (prompt and generated)
    num_slot_loads: int
    num_slot_evictions: int
