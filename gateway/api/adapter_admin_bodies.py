"""The bodies of the LoRA adapter admin API (/admin/v1/adapters), declared once as pydantic v2 models.

Validation, the OpenAPI schemas (`weir.gateway.api.openapi_admin`) and the `weir admin adapters` client
(`weir.tenancy.cli.adapter_admin_client` reads the same field names) derive from these. Bounds are the
records' constants (`weir.tenancy.catalog.adapter_records`), not restated; the records check them again.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import AliasChoices, AliasGenerator, AliasPath, BaseModel, ConfigDict, Field

from weir.tenancy.catalog.adapter_records import AdapterSpec
from weir.tenancy.store.enums import AdapterState
from weir.tenancy.store.models import (  # a tenant name's column; validate_tenant_name checks its characters
    MAX_ADAPTER_NAME_LEN,
    MAX_PATH_LEN,
    MODEL_VERSION_ID_LEN,
    NAME_LEN,
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AdapterRegisterBody(_Body):
    """POST /admin/v1/adapters: register an adapter of a base model version."""

    name: str = Field(
        min_length=1, max_length=MAX_ADAPTER_NAME_LEN, description="what clients put in `model`"
    )
    model_version: str = Field(
        min_length=3, max_length=MODEL_VERSION_ID_LEN, description="the base model version, name@version"
    )
    path: str = Field(
        min_length=1, max_length=MAX_PATH_LEN, description="the PEFT folder, under the server's --adapter-dir"
    )
    owner_tenant: str | None = Field(
        default=None,
        min_length=1,
        max_length=NAME_LEN,
        description="private to this tenant (and those granted); null: public until granted",
    )

    def spec(self) -> AdapterSpec:
        return AdapterSpec(self.name, self.model_version, self.path, self.owner_tenant)


class AdapterAccessBody(_Body):
    """POST /admin/v1/adapters/{name}/grant and /revoke: one tenant of the access list."""

    tenant: str = Field(min_length=1, max_length=NAME_LEN)


class AdapterRuntimeOut(BaseModel):
    """What the base version's engine holds of the adapter."""

    # model_validate(info) of an `AdapterInfo`.
    model_config = ConfigDict(from_attributes=True)

    rank: int
    target_modules: list[str]
    num_bytes: int
    slot: int | None = Field(description="the device slot holding it now; null: in host memory only")
    num_requests: int
    num_tokens: int
    num_slot_loads: int
    num_slot_evictions: int


def _status_or_record(field: str) -> AliasChoices:
    return AliasChoices(field, AliasPath("record", field))


class AdapterOut(BaseModel):
    """One adapter: its record, access, and what the running server knows."""

    # model_validate(status) of a `weir.gateway.fleet.adapter_rollout.AdapterStatus` (its record, serving,
    # in_flight and engine): a field the status does not carry is its record's.
    model_config = ConfigDict(
        from_attributes=True, alias_generator=AliasGenerator(validation_alias=_status_or_record)
    )

    object: Literal["adapter"] = "adapter"
    name: str
    model_version: str
    path: str
    owner_tenant: str | None
    allowed_tenants: list[str]
    public: bool = Field(validation_alias=AliasChoices("public", AliasPath("record", "is_public")))
    state: AdapterState
    failure_reason: str | None
    serving: bool = Field(description="requests naming it are routed to its base version now")
    in_flight: int
    runtime: AdapterRuntimeOut | None = Field(validation_alias=AliasChoices("runtime", "engine"))
    created_at: dt.datetime
    updated_at: dt.datetime
    updated_by: str


class AdapterListOut(BaseModel):
    """GET /admin/v1/adapters."""

    object: Literal["list"] = "list"
    data: list[AdapterOut]
