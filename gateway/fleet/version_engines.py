"""Engines for model versions: each one's footprint (weights + an explicit KV pool) and build.

The KV pool of a version holds its `kv_cache_tokens` tokens, else the server's
`--kv-cache-tokens`, else a default taken from what the budget has free at load time (CPU: 1 GiB,
as before; CUDA: 60% of the budget left after the weights). The footprint is known before any
weights are read (config.json: parameter count x dtype size), so a load that cannot fit is
refused up front by `MemoryBudget.reserve`.

The process-wide budget is `--memory-budget-mib`, else 90% of the device memory free at start
(CUDA) or 80% of the memory available to the machine (CPU). `memory_in_use` measures what is
really held (CUDA: bytes allocated by torch; CPU: the resident set), to report what a retire freed.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from weir.engine.kv.memory_budget import MemoryBudget, VersionFootprint
from weir.gateway.fleet.fleet_types import BuiltEngine
from weir.gateway.fleet.gc_pauses import refreeze_heap_if_frozen
from weir.gateway.settings.settings import Settings
from weir.tenancy.catalog.model_version_records import ModelVersionSpec

if TYPE_CHECKING:
    from weir.engine.config import EngineConfig

logger = logging.getLogger("weir.fleet")

CPU_DEFAULT_KV_BYTES = 1 << 30
CUDA_DEFAULT_KV_SHARE = 0.6
CUDA_BUDGET_SHARE = 0.9
CPU_BUDGET_SHARE = 0.8
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

BaseConfig = Callable[[Path], "EngineConfig"]


def _available_host_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else physical pages x page size."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_budget_bytes(settings: Settings, device: str) -> int:
    """The process-wide memory budget for model versions (see the module docstring)."""
    if settings.memory_budget_mib is not None:
        return settings.memory_budget_mib * 2**20
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * CUDA_BUDGET_SHARE)
    return int(_available_host_bytes() * CPU_BUDGET_SHARE)


def memory_in_use(device: str) -> int | None:
    """Bytes held now: torch's allocated CUDA memory, or this process's resident set on CPU."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.memory_allocated(torch.device(device)))
    try:
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_memory(device: str) -> None:
    """Collect a retired (or failed) version's objects, frozen ones included (gateway/fleet/gc_pauses.py),
    and hand the memory freed back to the device / the OS, so the retire is visible."""
    refreeze_heap_if_frozen("a model version was unloaded")
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        return
    try:  # glibc keeps freed arenas; malloc_trim returns them (no-op elsewhere)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class VersionEngineFactory:
    """Builds the `AsyncEngine` of a model version from the server's settings and its record."""

    def __init__(
        self, settings: Settings, device: str, budget: MemoryBudget, base_config: BaseConfig
    ) -> None:
        self.settings = settings
        self.device = device
        self.budget = budget
        self.base_config = base_config

    def dtype(self, spec: ModelVersionSpec) -> str:
        return spec.dtype or self.settings.resolved_dtype(self.device)

    def footprint(self, spec: ModelVersionSpec) -> VersionFootprint:
        """Weights (parameter count x dtype size, plus the CPU row weights' copies where they are on)
        plus the KV pool, from config.json alone."""
        from weir.engine.runner.loader import load_model_config

        model_config = load_model_config(spec.path)
        itemsize = _DTYPE_BYTES[self.dtype(spec)]
        weights = model_config.num_params() * itemsize
        from weir.engine.engine_builder import uses_row_weights

        if uses_row_weights(replace(self.base_config(Path(spec.path)), dtype=self.dtype(spec))):
            weights += model_config.linear_params() * itemsize  # the row copies (packed_linear.py)
        per_token = model_config.kv_bytes_per_token(itemsize)
        base = self.base_config(Path(spec.path))
        block_size = base.cache.block_size
        tokens = spec.kv_cache_tokens or self.settings.kv_cache_tokens
        if tokens is None:
            if self.device.startswith("cuda"):
                kv_bytes = int(max(self.budget.free_bytes - weights, 0) * CUDA_DEFAULT_KV_SHARE)
            else:
                kv_bytes = CPU_DEFAULT_KV_BYTES
            tokens = max(kv_bytes // per_token - block_size, block_size)
        lora = base.lora
        lora_bytes = (
            model_config.lora_slot_params(lora.num_slots, lora.max_rank) * itemsize if lora.enabled else 0
        )
        return VersionFootprint(weights, tokens, per_token, block_size, lora_bytes)

    def build(self, spec: ModelVersionSpec, footprint: VersionFootprint, model_version: str) -> BuiltEngine:
        """Load the weights and allocate the KV pool; `model_version` goes into its cache keys."""
        from weir.engine.async_engine import AsyncEngine

        base = self.base_config(Path(spec.path))
        dtype = self.dtype(spec)
        config = replace(
            base,
            dtype=dtype,
            model_version=model_version,
            tokenizer_path=spec.tokenizer,
            cache=replace(base.cache, num_blocks=footprint.num_blocks, kv_dtype=dtype),
        )
        logger.info("loading %s from %s on %s (%s)", model_version, spec.path, self.device, dtype)
        engine = AsyncEngine(config)
        refreeze_heap_if_frozen(
            f"loading {model_version}"
        )  # its modules and tensors live as long as it serves
        return BuiltEngine(engine, engine.tokenizer, engine.max_model_len, engine.model_config.vocab_size)
