"""Model versions as records: their states, the allowed moves between states, the typed inputs
and views, and a model name's traffic plan.

Inputs validate themselves on construction and raise `FieldError` naming the field, like the
other tenancy specs. A version's `id` is `"<name>@<version>"`: stable, unique per (name, version)
(neither part may contain `@`), readable in logs, and what the engine uses as its
`model_version` in prefix-cache keys.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from weir.engine.config import ENGINE_DTYPES
from weir.tenancy.errors import FieldError, InvalidModelTransitionError
from weir.tenancy.store.enums import ModelVersionState
from weir.tenancy.store.field_rules import validate_tenant_name
from weir.tenancy.store.models import MAX_NAME_LEN, MAX_PATH_LEN, MAX_VERSION_LEN

MAX_KV_CACHE_TOKENS = 2**31 - 1
MAX_SPLIT_VERSIONS = 64
MAX_PINS = 10_000
# Names appear in URL path segments (/admin/v1/models/{name}/...) and in the OpenAI `model`
# field, so no '/', no '@' (the id's separator), no spaces; upper case is kept (HF folder names).
MODEL_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_LEN - 1}}}")
VERSION_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_VERSION_LEN - 1}}}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


# The one table of allowed moves. `failed` is reached only from `loading`; `draining -> ready`
# is a rollback; `failed -> loading` a retry; `retired -> loading` a reload.
ALLOWED_TRANSITIONS: Mapping[ModelVersionState, frozenset[ModelVersionState]] = MappingProxyType(
    {
        ModelVersionState.REGISTERED: frozenset({ModelVersionState.LOADING}),
        ModelVersionState.LOADING: frozenset({ModelVersionState.READY, ModelVersionState.FAILED}),
        ModelVersionState.READY: frozenset({ModelVersionState.DRAINING}),
        ModelVersionState.DRAINING: frozenset({ModelVersionState.READY, ModelVersionState.RETIRED}),
        ModelVersionState.RETIRED: frozenset({ModelVersionState.LOADING}),
        ModelVersionState.FAILED: frozenset({ModelVersionState.LOADING}),
    }
)


def can_transition(current: ModelVersionState, new: ModelVersionState) -> bool:
    """Whether a version may move from `current` to `new` (staying put is not a move)."""
    return new in ALLOWED_TRANSITIONS[current]


def check_transition(name: str, version: str, current: ModelVersionState, new: ModelVersionState) -> None:
    """Raise `InvalidModelTransitionError` unless `current -> new` is in the table."""
    if not can_transition(current, new):
        allowed = sorted(s.value for s in ALLOWED_TRANSITIONS[current])
        raise InvalidModelTransitionError(name, version, current.value, new.value, allowed)


def version_id(name: str, version: str) -> str:
    """The stable id of a version: `name@version`."""
    return f"{name}@{version}"


def validate_model_name(name: object, field_name: str = "name") -> str:
    """A model name: 1-128 of [A-Za-z0-9._-], starting with a letter or digit."""
    return _label(name, MODEL_NAME_RE, MAX_NAME_LEN, field_name)


def validate_version_label(version: object, field_name: str = "version") -> str:
    """A version label: 1-64 of [A-Za-z0-9._-], starting with a letter or digit."""
    return _label(version, VERSION_RE, MAX_VERSION_LEN, field_name)


def _label(value: object, pattern: re.Pattern[str], max_len: int, field_name: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise FieldError(
            field_name,
            f"must be 1-{max_len} characters of A-Z, a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return value


def _check_path(value: object, field_name: str) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_PATH_LEN:
        raise FieldError(field_name, f"must be a non-blank string of at most {MAX_PATH_LEN} characters")
    if _CONTROL_RE.search(value):
        raise FieldError(field_name, "must not contain control characters")


@dataclass(frozen=True)
class ModelVersionSpec:
    """What is needed to register a model version: where its weights are and how to run it.

    `tokenizer` None: the weights folder's tokenizer; `dtype` None: the server's; and
    `kv_cache_tokens` None: the server's KV budget.
    """

    name: str
    version: str
    path: str
    tokenizer: str | None = None
    dtype: str | None = None
    kv_cache_tokens: int | None = None

    def __post_init__(self) -> None:
        validate_model_name(self.name)
        validate_version_label(self.version)
        _check_path(self.path, "path")
        if self.tokenizer is not None:
            _check_path(self.tokenizer, "tokenizer")
        if self.dtype is not None and self.dtype not in ENGINE_DTYPES:
            raise FieldError("dtype", f"must be one of {', '.join(ENGINE_DTYPES)}")
        kv = self.kv_cache_tokens
        if kv is not None and (
            isinstance(kv, bool) or not isinstance(kv, int) or not 1 <= kv <= MAX_KV_CACHE_TOKENS
        ):
            raise FieldError("kv_cache_tokens", f"must be an integer between 1 and {MAX_KV_CACHE_TOKENS}")

    @property
    def id(self) -> str:
        """The id the version will have."""
        return version_id(self.name, self.version)


@dataclass(frozen=True)
class ModelVersionView:
    """A model version as stored."""

    id: str  # name@version: the engine's model_version in prefix-cache keys
    name: str
    version: str
    path: str
    tokenizer: str | None
    dtype: str | None
    kv_cache_tokens: int | None
    state: ModelVersionState
    failure_reason: str | None  # set when state is failed; kept until the next successful load
    created_at: dt.datetime
    updated_at: dt.datetime
    updated_by: str

    @property
    def spec(self) -> ModelVersionSpec:
        """What was registered."""
        return ModelVersionSpec(
            name=self.name,
            version=self.version,
            path=self.path,
            tokenizer=self.tokenizer,
            dtype=self.dtype,
            kv_cache_tokens=self.kv_cache_tokens,
        )


def _freeze(mapping: object, field_name: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        raise FieldError(field_name, "must be an object")
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class TrafficPlan:
    """How a model name's new requests are spread over its versions.

    `split`: version -> percent, integers 0-100 that sum to 100, or empty (no plan: the server
    decides). `pins`: tenant -> version, a pinned tenant's requests always go to that version.
    Both are copied into read-only mappings. That the versions exist is checked by the
    repository, which knows them (`ModelVersionRepo.set_traffic`).
    """

    name: str
    split: Mapping[str, int]
    pins: Mapping[str, str]

    def __post_init__(self) -> None:
        validate_model_name(self.name)
        split = _freeze(self.split, "split")
        pins = _freeze(self.pins, "pins")
        object.__setattr__(self, "split", split)
        object.__setattr__(self, "pins", pins)
        if len(split) > MAX_SPLIT_VERSIONS:
            raise FieldError("split", f"must name at most {MAX_SPLIT_VERSIONS} versions")
        for version, percent in split.items():
            validate_version_label(version, "split")
            if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
                raise FieldError(f"split.{version}", "must be an integer percent between 0 and 100")
        if split and sum(split.values()) != 100:
            raise FieldError("split", f"percents must sum to 100, got {sum(split.values())}")
        if len(pins) > MAX_PINS:
            raise FieldError("pins", f"must pin at most {MAX_PINS} tenants")
        for tenant, version in pins.items():
            validate_tenant_name(tenant, "pins")
            validate_version_label(version, f"pins.{tenant}")

    def versions(self) -> frozenset[str]:
        """Every version the plan names, in its split or its pins."""
        return frozenset(self.split) | frozenset(self.pins.values())

    def percent(self, version: str) -> int:
        """The version's share of new unpinned requests (0 when the split does not name it)."""
        return self.split.get(version, 0)

    def pinned_tenants(self, version: str) -> tuple[str, ...]:
        """The tenants pinned to a version, sorted."""
        return tuple(sorted(t for t, v in self.pins.items() if v == version))
