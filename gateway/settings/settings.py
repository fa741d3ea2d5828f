"""Server settings: the one place that reads the environment.

Each setting is declared once, in the field groups beside this file (settings_server.py,
settings_model.py, settings_device.py, settings_scheduling.py, settings_prompts.py) with
`setting(...)` (setting_field.py): type, default, bounds, help and names. `Settings` joins them,
checks what spans several of them, and resolves the defaults that depend on the device.

Precedence is command line, then `WEIR_*` environment variables, then the defaults.
Secrets (admin token, key pepper) are read from the environment only, so they never show in `ps`.
A refused value raises ValueError with one line naming the setting.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass

from weir.engine.config import KVStoreConfig
from weir.engine.speculative_config import SpeculativeConfig
from weir.gateway.settings.setting_field import DeclaredSetting, declared_settings
from weir.gateway.settings.settings_device import DeviceFields
from weir.gateway.settings.settings_enums import (
    DTYPES,
    AttentionBackend,
    AuthMode,
    CpuRowWeightsMode,
    CudaGraphsMode,
    LogLevel,
    OtelExporter,
)
from weir.gateway.settings.settings_model import ModelFields
from weir.gateway.settings.settings_parsing import (
    check_forwarded_entry,
    is_loopback,
    parse_forwarded_allow_ips,
    parse_path,
    xdg_dir,
)
from weir.gateway.settings.settings_prompts import PromptFields
from weir.gateway.settings.settings_scheduling import SchedulingFields
from weir.gateway.settings.settings_server import ServerFields
from weir.gateway.settings.settings_sources import describe_errors, given_values
from weir.tenancy.responses.response_records import ResponseStorageLimits

__all__ = [
    "CPU_TARGET_STEP_MS",
    "DEFAULT_MODEL_NAME",
    "DTYPES",
    "AttentionBackend",
    "AuthMode",
    "CpuRowWeightsMode",
    "CudaGraphsMode",
    "LogLevel",
    "OtelExporter",
    "Settings",
    "declared",
    "parse_forwarded_allow_ips",
    "parse_path",
    "setting_groups",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

# The default target step on CPU (docs/benchmarks.md, issue 13): on two cores, of 500/800/1,200
# ms in one guidellm run it gave the best throughput and ITL with TTFT still under the peer's.
CPU_TARGET_STEP_MS = 800.0


@dataclass(frozen=True, config=ConfigDict(hide_input_in_errors=True))
class Settings(PromptFields, SchedulingFields, DeviceFields, ModelFields, ServerFields):
    """Everything `weir serve` needs, resolved and validated (fields: the groups it joins).

    `auth` None means: no key check on a loopback address without an admin token (a fresh local
    install), API keys everywhere else. Use `auth_mode` for the resolved value.
    """

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every range check (each comparison is False)
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"{f.name} must be a number, got nan")
        for entry in self.forwarded_allow_ips:
            check_forwarded_entry(entry)
        if self.metrics_port != 0 and self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port, both are {self.port}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be blank")
        SpeculativeConfig.parse(self.speculative, self.num_speculative_tokens)  # ValueError names it
        self.kv_store_config()  # ValueError names the setting

    @property
    def auth_mode(self) -> AuthMode:
        """The resolved auth mode (see the class docstring)."""
        if self.auth is not None:
            return self.auth
        if is_loopback(self.host) and not self.admin_token:
            return AuthMode.NONE
        return AuthMode.KEYS

    @property
    def response_storage_limits(self) -> ResponseStorageLimits:
        """Each tenant's storage quota and retention period for stored responses."""
        return ResponseStorageLimits(self.response_storage_bytes, self.response_retention_s)

    @property
    def resolved_database_url(self) -> str:
        """`database_url`, or a SQLite file inside `data_dir`."""
        return self.database_url or f"sqlite:///{self.data_dir / 'weir.db'}"

    def model_name(self, model_path: Path | None = None) -> str:
        """The name clients put in `model`: explicit, else the model folder's name."""
        if self.served_model_name:
            return self.served_model_name
        path = model_path or self.model_path
        return path.name if path is not None else DEFAULT_MODEL_NAME

    def kv_store_config(self) -> KVStoreConfig | None:
        """The engine's KV store tier settings; None when `kv_store_url` is not set."""
        if self.kv_store_url is None:
            return None
        if not self.kv_store_secret:
            raise ValueError("kv_store_url is set but WEIR_KV_STORE_SECRET is not (the values' MAC key)")
        try:
            return KVStoreConfig(
                url=self.kv_store_url,
                secret=self.kv_store_secret.encode(),
                password=self.kv_store_password,
                namespace=self.kv_store_namespace,
                ttl_s=self.kv_store_ttl_s,
                max_bytes=self.kv_store_max_mib << 20,
                timeout_s=self.kv_store_timeout_ms / 1e3,
            )
        except ValueError as exc:
            raise ValueError(f"kv_store: {exc}") from None

    def resolved_dtype(self, device: str) -> str:
        """`dtype`, defaulting to float32 on CPU and bfloat16 on an accelerator."""
        if self.dtype is not None:
            return self.dtype
        return "float32" if device == "cpu" else "bfloat16"

    def engine_threads(self, device: str, cores: int) -> int | None:
        """The engine's intra-op threads on `device` for a process that may run on `cores` cores:
        on CPU, `cores - cpu_reserved_cores`, at least one; None (torch's default) on a GPU."""
        if device != "cpu":
            return None
        return max(1, cores - self.cpu_reserved_cores)

    def wide_step_threads(self, device: str, cores: int) -> int | None:
        """The engine's intra-op threads for wide steps on `device` (`cpu_wide_step_threads`,
        default every one of `cores`); None on a GPU, when off (0), or when it is the engine's
        own count (nothing to switch)."""
        threads = self.engine_threads(device, cores)
        if threads is None or self.cpu_wide_step_threads == 0:
            return None
        wanted = cores if self.cpu_wide_step_threads is None else self.cpu_wide_step_threads
        return None if wanted == threads else wanted

    def resolved_target_step_s(self, device: str) -> float | None:
        """The target step time in seconds, None for a fixed budget: `target_step_ms` (0: none),
        defaulting to CPU_TARGET_STEP_MS on CPU and none on an accelerator."""
        ms = self.target_step_ms
        if ms is None:
            ms = CPU_TARGET_STEP_MS if device == "cpu" else 0.0
        return ms / 1000 if ms > 0 else None

    @classmethod
    def from_sources(cls, cli: Mapping[str, Any] | argparse.Namespace, env: Mapping[str, str]) -> Settings:
        """Merge command-line values (None = not given) over `WEIR_*` env values over defaults.

        `env` is passed in (normally `os.environ`) so nothing reads the environment implicitly.
        """
        values = given_values(declared(), cli, env)
        if "data_dir" not in values:
            values["data_dir"] = xdg_dir(env, "XDG_DATA_HOME", ".local/share")
        if "cache_dir" not in values:
            values["cache_dir"] = xdg_dir(env, "XDG_CACHE_HOME", ".cache")
        return cls(**values)

    @classmethod
    def from_environment(cls, cli: Mapping[str, Any] | argparse.Namespace | None = None) -> Settings:
        """`from_sources` with the process environment; the only call that touches os.environ."""
        return cls.from_sources(cli or {}, os.environ)


@functools.cache
def declared() -> tuple[DeclaredSetting, ...]:
    """Every setting's declaration, in the order of the groups (flags, docs and chart follow it)."""
    return tuple(declared_settings(Settings))


def setting_groups() -> tuple[type, ...]:
    """The field groups `Settings` joins, in its fields' order (`weir serve --help` lists by group)."""
    return tuple(cls for cls in reversed(Settings.__mro__) if cls not in (object, Settings))


def _one_line_errors(init: Callable[..., None]) -> Callable[..., None]:
    """Settings' constructor, reporting pydantic's errors as one ValueError line naming each setting."""

    @functools.wraps(init)
    def checked_init(self: Settings, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            by_name = {setting.name: setting for setting in declared()}
            raise ValueError(describe_errors(by_name, exc, kwargs)) from None

    return checked_init


setattr(Settings, "__init__", _one_line_errors(Settings.__init__))  # noqa: B010 (mypy: method-assign)
