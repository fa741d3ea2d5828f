"""Model-version bodies (`/admin/v1/models...`): register, traffic, rollback, and the version,
plan and list objects the routes answer. The server's routes parse and render with them, and
`weir admin models` (`weir.tenancy.cli.model_admin_client`) builds its requests and reads the answers
with them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from weir.engine.config import ENGINE_DTYPES
from weir.tenancy.admin_bodies.fields import ModelName, UtcTime, VersionLabel
from weir.tenancy.catalog.model_version_records import (
    MAX_KV_CACHE_TOKENS,
    ModelVersionSpec,
    ModelVersionView,
    TrafficPlan,
)
from weir.tenancy.errors import FieldError
from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import integral
from weir.tenancy.store.enums import ModelVersionState
from weir.tenancy.store.models import MAX_PATH_LEN


@dataclass(frozen=True)
class VersionRuntime:
    """What the server knows about a loaded version beyond its record."""

    in_flight: int = 0  # requests running on it now
    kv_usage: float | None = None  # fraction of its KV pool in use; None: not loaded


@dataclass(frozen=True)
class ModelVersionListing:
    """One entry of `GET /admin/v1/models`: the record, its traffic share and its runtime."""

    view: ModelVersionView
    traffic_percent: int
    pinned_tenants: tuple[str, ...]
    runtime: VersionRuntime


Path = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_PATH_LEN)]
Dtype = Annotated[str, Field(strict=True, json_schema_extra={"enum": list(ENGINE_DTYPES)})]
KvTokens = Annotated[
    Annotated[int, Field(ge=1, le=MAX_KV_CACHE_TOKENS, strict=True)] | None, BeforeValidator(integral)
]
Percent = Annotated[int, BeforeValidator(integral), Field(ge=0, le=100, strict=True)]


def _empty_if_null(value: object) -> object:
    return {} if value is None else value


class ModelVersionCreate(BaseModel):
    """`POST /admin/v1/models`: register a version (it loads on `.../load`)."""

    # model_validate(spec): the request body of a `ModelVersionSpec` (what the CLI sends).
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    name: ModelName
    version: VersionLabel
    path: Path = Field(description="A Hugging Face model folder on the server.")
    dtype: Dtype | None = None
    kv_cache_tokens: KvTokens = None
    tokenizer: Path | None = None

    def spec(self) -> ModelVersionSpec:
        """The repository's input (it checks the dtype and a non-blank path)."""
        return ModelVersionSpec(**dict(self))  # the same fields


class TrafficBody(BaseModel):
    """`PUT /admin/v1/models/{name}/traffic`: the whole plan (an absent part is empty).

    Split percents sum to 100 (or the split is empty); pins send a tenant to one version. Every
    version with a share or a pin must be ready (409 otherwise)."""

    # model_validate(plan): the body of a `TrafficPlan` (its `name` is the path's).
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    split: Annotated[dict[str, Percent], BeforeValidator(_empty_if_null)] = Field(
        default_factory=dict, description="version -> percent"
    )
    pins: Annotated[dict[str, VersionLabel], BeforeValidator(_empty_if_null)] = Field(
        default_factory=dict, description="tenant -> version"
    )

    def plan(self, name: str) -> TrafficPlan:
        return TrafficPlan(name=name, split=self.split, pins=self.pins)


class TrafficPlanBody(TrafficBody):
    """A model's plan as the traffic and rollback routes answer it."""

    name: ModelName


class Rollback(BaseModel):
    """`POST /admin/v1/models/{name}/rollback`: every share back to one version."""

    model_config = ConfigDict(extra="forbid")

    to: VersionLabel


class VersionAction(BaseModel):
    """`POST .../drain` and `.../retire`'s optional body (`?force=true` says the same)."""

    model_config = ConfigDict(extra="forbid")

    force: bool = Field(
        False,
        description="Drain or retire the last ready version of the model anyway: its requests are "
        "then answered 503 model_unavailable (with Retry-After) until a version is ready again.",
    )


class ModelVersion(BaseModel):
    """A version: its record, its traffic share and pins, and its runtime figures."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="name@version")
    name: ModelName
    version: VersionLabel
    path: str
    tokenizer: str | None
    dtype: str | None
    kv_cache_tokens: int | None
    state: ModelVersionState
    failure_reason: str | None
    created_at: UtcTime
    updated_at: UtcTime
    updated_by: str
    traffic_percent: Percent = 0
    pinned_tenants: list[str] = Field(default_factory=list)
    in_flight: Annotated[int, Field(ge=0, strict=True)] = 0
    kv_usage: Annotated[float, Field(allow_inf_nan=False)] | None = None

    @classmethod
    def of(
        cls, view: ModelVersionView, plan: TrafficPlan | None = None, runtime: VersionRuntime | None = None
    ) -> ModelVersion:
        """A version with its share of `plan` (0 and no pins without one) and its runtime figures."""
        run = runtime if runtime is not None else VersionRuntime()
        return cls(
            **{f.name: getattr(view, f.name) for f in dataclasses.fields(view)},
            traffic_percent=0 if plan is None else plan.percent(view.version),
            pinned_tenants=[] if plan is None else list(plan.pinned_tenants(view.version)),
            in_flight=run.in_flight,
            kv_usage=run.kv_usage,
        )

    def listing(self) -> ModelVersionListing:
        """The record and figures (the inverse of `of`); `FieldError` if the id does not match."""
        view = ModelVersionView(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelVersionView)}
        )
        ModelVersionSpec(view.name, view.version, view.path, view.tokenizer, view.dtype, view.kv_cache_tokens)
        if self.id != f"{self.name}@{self.version}":
            raise FieldError("id", f"must be {self.name + '@' + self.version!r}")
        return ModelVersionListing(
            view=view,
            traffic_percent=self.traffic_percent,
            pinned_tenants=tuple(self.pinned_tenants),
            runtime=VersionRuntime(in_flight=self.in_flight, kv_usage=self.kv_usage),
        )


class ModelVersionList(BaseModel):
    """`GET /admin/v1/models`: every version and every model's plan."""

    model_config = ConfigDict(extra="forbid")

    data: list[ModelVersion] = Field(default_factory=list)
    traffic: dict[str, TrafficBody] = Field(default_factory=dict, description="model name -> plan")

    @classmethod
    def of(
        cls,
        versions: Iterable[ModelVersion],
        plans: Mapping[str, TrafficPlan],
    ) -> ModelVersionList:
        return cls(
            data=list(versions),
            traffic={name: TrafficBody.model_validate(plan) for name, plan in sorted(plans.items())},
        )

    def parsed(self) -> tuple[list[ModelVersionListing], dict[str, TrafficPlan]]:
        """The listings and the plans (the inverse of `of`)."""
        return [v.listing() for v in self.data], {n: b.plan(n) for n, b in self.traffic.items()}


def parse_spec(body: object) -> ModelVersionSpec:
    """`POST /admin/v1/models`'s body as the repository's input."""
    return parse_model(ModelVersionCreate, body).spec()


def parse_traffic(name: str, body: object) -> TrafficPlan:
    """`PUT /admin/v1/models/{name}/traffic`'s body as the plan of model `name`."""
    return parse_model(TrafficBody, body).plan(name)


def parse_version_action(body: object, force_query: str | None) -> bool:
    """Whether a drain or retire is forced: `{"force": true}` in the body or `?force=true`."""
    if force_query is not None and force_query not in ("true", "false"):
        raise FieldError("force", "must be true or false")
    return parse_model(VersionAction, body).force or force_query == "true"


def parse_rollback(body: object) -> str:
    """`POST /admin/v1/models/{name}/rollback`'s body: the version to roll back to."""
    return parse_model(Rollback, body).to
