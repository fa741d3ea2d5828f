"""The LoRA adapters of one engine: loaded in host memory, copied into device slots as steps need them.

Owned by the runner and used only on the engine thread. `step` turns the adapters of a step's
requests into a `LoraStep` (each token's slot), loading adapters into slots first (LRU eviction,
engine/lora/lora_slots.py). An adapter evicted from its slot stays loaded in host memory: the next
step that needs it copies it back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weir.engine.config import LoraConfig, ModelConfig
from weir.engine.lora.lora_adapter import LoraAdapter, load_adapter
from weir.engine.lora.lora_deltas import LoraStep
from weir.engine.lora.lora_slots import LoraSlots, split_by_slots
from weir.engine.lora.lora_types import (
    AdapterInfo,
    AdapterLoadError,
    AdapterRef,
    UnknownAdapterError,
)

logger = logging.getLogger("weir.engine")


@dataclass
class _Counters:
    num_requests: int = 0
    num_tokens: int = 0
    num_slot_loads: int = 0
    num_slot_evictions: int = 0


class LoraManager:
    """Loaded adapters, the slot LRU, and the model's slot tensors."""

    def __init__(
        self,
        config: LoraConfig,
        model: Any,  # LlamaForCausalLM: enable_lora, set_lora_slot
        model_config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        base_models: frozenset[str] = frozenset(),
    ) -> None:
        if not config.enabled:
            raise ValueError("LoraConfig.num_slots is 0: LoRA is disabled")
        self.config = config
        self.model = model
        self.model_config = model_config
        self.dtype = dtype
        self.device = device
        self.base_models = base_models
        self.slot_bytes = model.enable_lora(config.num_slots, config.max_rank)
        self.slots = LoraSlots(config.num_slots)
        self._adapters: dict[str, LoraAdapter] = {}
        self._counters: dict[str, _Counters] = {}

    @property
    def num_slots(self) -> int:
        return self.config.num_slots

    # -- loading --------------------------------------------------------------------------------

    def read(self, name: str, path: str | Path) -> LoraAdapter:
        """Read and check the adapter at `path` (under the adapter directory) without holding it:
        touches no state, so it may run off the engine thread. Raises AdapterLoadError."""
        return load_adapter(
            name, path, self.config.adapter_dir, self.model_config, self.config.max_rank, self.base_models
        )

    def load(self, name: str, path: str | Path) -> AdapterInfo:
        """`read`, then `add`: hold the adapter at `path` as `name` (replacing one of that name)."""
        return self.add(self.read(name, path))

    def add(self, adapter: LoraAdapter) -> AdapterInfo:
        """Hold an already checked adapter (replacing one of the same name)."""
        if len(self._adapters) >= self.config.max_adapters and adapter.name not in self._adapters:
            raise AdapterLoadError(
                f"{self.config.max_adapters} adapters are loaded already; unload one first"
            )
        if adapter.rank > self.config.max_rank:
            raise AdapterLoadError(
                f"adapter rank {adapter.rank} is over the configured maximum {self.config.max_rank}"
            )
        if adapter.name in self._adapters:
            self._drop_slot(adapter.name)
        self._adapters[adapter.name] = adapter
        self._counters.setdefault(adapter.name, _Counters())
        return self.info(adapter.name)

    def remove(self, name: str) -> AdapterInfo:
        """Forget an adapter (the caller checks that no request uses it); frees its slot."""
        info = self.info(name)
        self._drop_slot(name)
        del self._adapters[name]
        return info

    def _drop_slot(self, name: str) -> None:
        slot = self.slots.release(name)
        if slot is not None:
            self.model.set_lora_slot(slot, None)

    def ref(self, name: str) -> AdapterRef:
        """The adapter's reference for a request, or UnknownAdapterError."""
        adapter = self._adapters.get(name)
        if adapter is None:
            raise UnknownAdapterError(name)
        self._counters[name].num_requests += 1
        return AdapterRef(name, adapter.fingerprint)

    def has(self, name: str) -> bool:
        return name in self._adapters

    def info(self, name: str) -> AdapterInfo:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise UnknownAdapterError(name)
        c = self._counters[name]
        return AdapterInfo(
            name=name,
            path=adapter.path,
            rank=adapter.rank,
            target_modules=adapter.target_modules,
            fingerprint=adapter.fingerprint,
            num_bytes=adapter.num_bytes,
            slot=self.slots.slot_of(name),
            num_requests=c.num_requests,
            num_tokens=c.num_tokens,
            num_slot_loads=c.num_slot_loads,
            num_slot_evictions=c.num_slot_evictions,
        )

    def infos(self) -> tuple[AdapterInfo, ...]:
        return tuple(self.info(n) for n in sorted(self._adapters))

    # -- steps ----------------------------------------------------------------------------------

    def split(self, names: Sequence[str | None]) -> list[list[int]]:
        """Sub-batches of a step (indices into `names`), each within the slot count."""
        return split_by_slots(names, self.num_slots)

    def step(self, names: Sequence[str | None], num_tokens: Sequence[int]) -> LoraStep | None:
        """The LoraStep of sequences laid back to back (`names[i]`'s adapter, None for the base,
        over `num_tokens[i]` tokens); None when none uses an adapter. Loads missing adapters
        into slots first. At most `num_slots` distinct adapters (see `split`)."""
        wanted = [n for n in names if n is not None]
        if not wanted:
            return None
        for name in wanted:
            if name not in self._adapters:
                raise UnknownAdapterError(name)
        slot_of, loads = self.slots.acquire(wanted)
        for load in loads:
            adapter = self._adapters[load.name]
            self.model.set_lora_slot(load.slot, adapter.weights, adapter.scaling)
            self._counters[load.name].num_slot_loads += 1
            if load.evicted is not None and load.evicted in self._counters:
                self._counters[load.evicted].num_slot_evictions += 1
        token_slots: list[int] = []
        for seq_adapter, count in zip(names, num_tokens, strict=True):
            token_slots.extend([-1 if seq_adapter is None else slot_of[seq_adapter]] * count)
            if seq_adapter is not None:
                self._counters[seq_adapter].num_tokens += count
        slots = torch.tensor(token_slots, dtype=torch.int64, device=self.device)  # [num_tokens]
        bits = sum(1 << s for s in set(slot_of.values()))
        # The model's Triton path (CUDA) takes the gathered kernels; the torch path the masked form.
        kernels = bool(getattr(self.model, "fused_kernels", False))
        return LoraStep(slots, max(slot_of.values()) + 1, self.dtype, bits, kernels)
