"""Loading, replacing and unloading one engine's LoRA adapters (`LLMEngine.adapter_admin`).

An adapter is read and checked first (`read_adapter`: touches no engine state, so the async
engine runs it off the engine thread), then held (`add_adapter`, on the engine thread). A name
that is already loaded is replaced, and an adapter unloaded, only while no queued or running
request goes through it (`AdapterInUseError`). The adapters, their slots and counters are the
runner's `LoraManager`; this facade adds the check against the scheduler's requests. Plain
Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from weir.engine.lora.lora_adapter import LoraAdapter
from weir.engine.lora.lora_manager import LoraManager
from weir.engine.lora.lora_types import AdapterInfo, AdapterInUseError, AdapterLoadError, UnknownAdapterError
from weir.engine.request import Request


class AdapterAdmin:
    """One engine's LoRA adapters, checked against the requests that use them."""

    def __init__(self, lora: LoraManager | None, requests: Mapping[str, Request]) -> None:
        self._manager = lora  # None: LoRA is not enabled on this engine
        self._requests = requests  # the scheduler's queued and running requests (live)

    def _lora(self) -> LoraManager:
        if self._manager is None:
            raise AdapterLoadError(
                "LoRA is not enabled on this engine (lora.num_slots is 0; `weir serve --adapter-dir DIR` enables it)"
            )
        return self._manager

    def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Read, check and hold a PEFT adapter (AdapterLoadError if refused).

        Loading a name that is already loaded replaces it, only while no request uses it.
        """
        return self.add_adapter(self.read_adapter(name, path))

    def read_adapter(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter without holding it (safe off the engine thread: touches no
        engine state); `add_adapter` then holds it."""
        return self._lora().read(name, path)

    def add_adapter(self, adapter: LoraAdapter) -> AdapterInfo:
        """Hold an adapter `read_adapter` checked (replacing one of its name, only while unused)."""
        lora = self._lora()
        if lora.has(adapter.name):
            self._check_unused(adapter.name)
        return lora.add(adapter)

    def unload_adapter(self, name: str) -> AdapterInfo:
        """Forget an adapter; AdapterInUseError while a request through it is queued or running."""
        lora = self._lora()
        if not lora.has(name):
            raise UnknownAdapterError(name)
        self._check_unused(name)
        return lora.remove(name)

    def _check_unused(self, name: str) -> None:
        users = sum(1 for r in self._requests.values() if r.adapter is not None and r.adapter.name == name)
        if users:
            raise AdapterInUseError(f"adapter {name!r} is used by {users} queued or running request(s)")

    def adapters(self) -> tuple[AdapterInfo, ...]:
        """Every loaded adapter, with its slot and counters."""
        return self._manager.infos() if self._manager is not None else ()
