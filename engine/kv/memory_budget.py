"""One process-wide memory budget that every loaded model version reserves from (torch-free).

Each engine's footprint is explicit: its weights plus a KV pool sized in tokens (the version's
`kv_cache_tokens`, else the server's). A load reserves the whole footprint before any weights
are read; a footprint that does not fit is refused with the numbers, and the versions already
serving keep what they hold. Retiring a version releases exactly what it reserved.

The budget is accounting, not an allocator: it bounds what the fleet asks of the device. The
real memory freed by a retire is measured separately (weir.gateway.fleet.model_fleet).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from weir.engine.errors import EngineError

# The block pool keeps one block back (the null block): a pool of N tokens holds one more.
RESERVED_KV_BLOCKS = 1


@dataclass(frozen=True)
class VersionFootprint:
    """The memory one engine needs: weights plus a KV pool of `kv_tokens` tokens, plus its LoRA
    slots (`lora_bytes`, 0 without adapters). Loaded adapters' host copies are reserved one by
    one as they load (`adapter_owner`)."""

    weights_bytes: int
    kv_tokens: int
    kv_bytes_per_token: int
    block_size: int
    lora_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("weights_bytes", "kv_bytes_per_token", "lora_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kv_tokens < 1:
            raise ValueError(f"kv_tokens must be >= 1, got {self.kv_tokens}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def num_blocks(self) -> int:
        """KV blocks to allocate for `kv_tokens`, the reserved block included."""
        return math.ceil(self.kv_tokens / self.block_size) + RESERVED_KV_BLOCKS

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    @property
    def num_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.lora_bytes

    def describe(self) -> str:
        lora = f" + LoRA slots {self.lora_bytes}" if self.lora_bytes else ""
        return (
            f"{self.num_bytes} bytes (weights {self.weights_bytes} + KV {self.kv_bytes} for "
            f"{self.kv_tokens} tokens at {self.kv_bytes_per_token} bytes per token{lora})"
        )


def adapter_owner(version_id: str, adapter: str) -> str:
    """The budget owner of adapter `adapter`'s host copy on version `version_id`'s engine."""
    return f"{version_id}#adapter:{adapter}"


class MemoryBudgetError(EngineError):
    """A reservation that does not fit the budget; the message gives needed vs free."""

    def __init__(
        self, owner: str, needed_bytes: int, free_bytes: int, total_bytes: int, what: str = ""
    ) -> None:
        need = what or f"{needed_bytes} bytes"
        super().__init__(
            f"{owner} does not fit the memory budget: it needs {need}, but only {free_bytes} of "
            f"{total_bytes} bytes are free"
        )
        self.owner = owner
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes


@dataclass(frozen=True)
class Reservation:
    """What one owner holds."""

    owner: str
    num_bytes: int


class MemoryBudget:
    """A fixed number of bytes shared by owners; thread-safe (loads run in worker threads)."""

    def __init__(self, total_bytes: int) -> None:
        if total_bytes < 1:
            raise ValueError(f"total_bytes must be >= 1, got {total_bytes}")
        self.total_bytes = total_bytes
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def reserved_bytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.reserved_bytes

    def held(self, owner: str) -> int:
        """Bytes `owner` holds (0 if none)."""
        with self._lock:
            return self._held.get(owner, 0)

    def reservations(self) -> tuple[Reservation, ...]:
        with self._lock:
            return tuple(Reservation(o, n) for o, n in sorted(self._held.items()))

    def reserve(self, owner: str, num_bytes: int, what: str = "") -> Reservation:
        """Reserve `num_bytes` for `owner`, or raise `MemoryBudgetError` (nothing changes then).

        An owner holds at most one reservation: reserving again while holding one is a bug.
        """
        if num_bytes < 0:
            raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
        with self._lock:
            if owner in self._held:
                raise ValueError(f"{owner} already holds a reservation of {self._held[owner]} bytes")
            free = self.total_bytes - sum(self._held.values())
            if num_bytes > free:
                raise MemoryBudgetError(owner, num_bytes, free, self.total_bytes, what)
            self._held[owner] = num_bytes
            return Reservation(owner, num_bytes)

    def release(self, owner: str) -> int:
        """Give back everything `owner` holds; the bytes released (0 if it held nothing)."""
        with self._lock:
            return self._held.pop(owner, 0)
