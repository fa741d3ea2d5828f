"""How `weir serve` builds its fleet of model versions and what it binds to the fleet.

- `build_fleet`: the process-wide memory budget, the engine factory and the memory probe.
- `startup_spec`: the version `--model` is registered and served as (name from
  `--served-model-name` or the folder, label from `--model-version`, "default" by default).
- `prefix_cache_target` / `primary_prefix_stats`: the prefix-cache admin routes and metrics act
  on one version: the one named by `?model=&version=`, else the default model's serving version.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from weir.engine.client import PrefixCacheControl
from weir.engine.kv.memory_budget import MemoryBudget
from weir.engine.kv.prefix_cache_types import PrefixCacheStats
from weir.gateway.fleet.model_fleet import FleetVersion, ModelFleet
from weir.gateway.fleet.version_engines import (
    BaseConfig,
    VersionEngineFactory,
    default_budget_bytes,
    memory_in_use,
    release_memory,
)
from weir.gateway.http.errors import NotFoundError
from weir.gateway.prompts.tokenization import DEFAULT_POOL_WORKERS
from weir.gateway.routes.prefix_cache import PrefixCacheTarget
from weir.gateway.settings.settings import Settings
from weir.tenancy.catalog.model_version_records import ModelVersionSpec

logger = logging.getLogger("weir.serve")


class StartupModelError(ValueError):
    """The `--model` version cannot be registered as given (its name, or a clash with its record)."""


def build_fleet(settings: Settings, device: str, base_config: BaseConfig) -> ModelFleet:
    """An empty fleet that loads versions on `device` within the memory budget; `base_config`
    is the server's EngineConfig for a weights folder (each version's own fields go over it)."""
    budget = MemoryBudget(default_budget_bytes(settings, device))
    logger.info("memory budget for model versions: %.1f MiB on %s", budget.total_bytes / 2**20, device)
    factory = VersionEngineFactory(settings, device, budget, base_config)
    return ModelFleet(
        factory,
        budget,
        memory_probe=functools.partial(memory_in_use, device),
        release_memory=functools.partial(release_memory, device),
        # one copy per worker of the routes' pool and of the prompt builder's default pool (the
        # prefix-cache routes' text encoding), so no worker makes one while serving
        tokenizer_copies=settings.tokenizer_workers + DEFAULT_POOL_WORKERS,
    )


def startup_spec(settings: Settings, model_path: Path) -> ModelVersionSpec:
    """The version `weir serve --model PATH` registers (if absent) and loads."""
    from weir.tenancy.errors import FieldError

    name = settings.model_name(model_path)
    try:
        return ModelVersionSpec(name=name, version=settings.model_version, path=str(model_path))
    except FieldError as exc:
        raise StartupModelError(f"the served model name {name!r} cannot be used: {exc.message}") from None


def check_startup_record(spec: ModelVersionSpec, recorded_path: str | None) -> None:
    """A registered version never changes its weights: another path needs another version label."""
    if recorded_path is not None and Path(recorded_path).resolve() != Path(spec.path).resolve():
        raise StartupModelError(
            f"model {spec.name!r} version {spec.version!r} is registered with the weights at "
            f"{recorded_path!r}, not {spec.path!r}; pass --model-version with a new label to serve "
            "these weights as a new version"
        )


def _engine_control(entry: FleetVersion | None) -> PrefixCacheControl | None:
    if entry is None or entry.engine is None:
        return None
    control: PrefixCacheControl | None = getattr(entry.engine, "prefix_cache", None)
    return control


def prefix_cache_target(
    fleet: ModelFleet, default_name: str, model: str | None, version: str | None
) -> PrefixCacheTarget:
    """The version a prefix-cache admin call acts on (404 when it is not loaded)."""
    name = model or default_name
    entry = fleet.get(f"{name}@{version}") if version is not None else fleet.primary(name)
    control = _engine_control(entry)
    if entry is None or control is None or entry.prompts is None:
        what = f"model {name!r}" + (f" version {version!r}" if version is not None else "")
        raise NotFoundError(
            f"{what} has no loaded version with a prefix cache", code="model_version_not_found"
        )
    return PrefixCacheTarget(control, entry.prompts)


def primary_prefix_stats(fleet: ModelFleet, default_name: str) -> PrefixCacheStats:
    """The serving version's prefix-cache snapshot, for the metrics scrape (raises if none)."""
    control = _engine_control(fleet.primary(default_name) or fleet.primary())
    if control is None:
        raise LookupError("no loaded model version")
    return control.snapshot()
