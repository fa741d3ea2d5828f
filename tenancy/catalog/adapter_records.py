"""LoRA adapter records (torch-free): what an admin registers, its states, and who may call it.

An adapter has a public name, unique across the server: it is what a client puts in `model`.
It belongs to one base model version (`name@version`), which must be the version that serves
it. Who may call it: everybody while it has no owner and no grant (public); else its owner
(`owner_tenant`) and the tenants it is granted to (`allowed_tenants`, the access list). For every
other tenant it does not exist (the gateway answers 404, as for an unknown model).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from weir.tenancy.errors import FieldError
from weir.tenancy.store.enums import AdapterState
from weir.tenancy.store.models import MAX_ADAPTER_NAME_LEN, MAX_PATH_LEN, MAX_REASON_LEN

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


ADAPTER_TRANSITIONS: dict[AdapterState, frozenset[AdapterState]] = {
    AdapterState.REGISTERED: frozenset({AdapterState.LOADED, AdapterState.FAILED, AdapterState.RETIRED}),
    AdapterState.LOADED: frozenset({AdapterState.UNLOADED, AdapterState.FAILED}),
    AdapterState.UNLOADED: frozenset({AdapterState.LOADED, AdapterState.FAILED, AdapterState.RETIRED}),
    # failed -> failed: a load tried again failed again, with its new reason.
    AdapterState.FAILED: frozenset(
        {AdapterState.LOADED, AdapterState.UNLOADED, AdapterState.FAILED, AdapterState.RETIRED}
    ),
    AdapterState.RETIRED: frozenset(),
}


def validate_adapter_name(name: object) -> str:
    """An adapter name: 1-128 characters, letters, digits and . _ : / - (no '@', which names
    model versions); FieldError otherwise."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_ADAPTER_NAME_LEN or not _NAME.match(name):
        raise FieldError(
            "name",
            f"must be 1-{MAX_ADAPTER_NAME_LEN} characters: letters, digits and . _ : / -, not starting with a symbol",
        )
    return name


@dataclass(frozen=True)
class AdapterSpec:
    """What an admin registers: the adapter's name, its base model version, its folder (relative
    to the server's adapter directory, which the engine enforces) and its owner."""

    name: str
    model_version: str  # name@version of the base
    path: str
    owner_tenant: str | None = None  # None: public

    def __post_init__(self) -> None:
        validate_adapter_name(self.name)
        if not isinstance(self.model_version, str) or self.model_version.count("@") != 1:
            raise FieldError("model_version", "must be a model version id, name@version")
        if not isinstance(self.path, str) or not 1 <= len(self.path) <= MAX_PATH_LEN or "\x00" in self.path:
            raise FieldError("path", f"must be a path of 1-{MAX_PATH_LEN} characters")
        if self.owner_tenant is not None and not isinstance(self.owner_tenant, str):
            raise FieldError("owner_tenant", "must be a tenant name or null")


@dataclass(frozen=True)
class AdapterView:
    """One registered adapter, detached from the database."""

    name: str
    model_version: str
    path: str
    owner_tenant: str | None
    state: AdapterState
    failure_reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    updated_by: str
    allowed_tenants: tuple[str, ...] = ()  # granted besides the owner, by name

    @property
    def is_public(self) -> bool:
        return self.owner_tenant is None and not self.allowed_tenants

    def visible_to(self, tenant: str) -> bool:
        """Whether `tenant` may call it (and so see it)."""
        return self.is_public or self.owner_tenant == tenant or tenant in self.allowed_tenants


__all__ = ["MAX_REASON_LEN"]
