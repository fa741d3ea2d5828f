"""A tenant's (or an API key's) limits: the ONE declaration of the quota fields.

`QuotaLimits` is a plain frozen dataclass (it does not validate on construction: the gateway
builds it on every authentication), but its fields are annotated with pydantic constraints, so
pydantic validates it as an admin API body. Everything else derives from these annotations:

- the admin API's quota body, the key-limits body and their JSON Schema
  (`weir.tenancy.admin_bodies.quota`);
- the database mapping (`weir.tenancy.repository.row_mapping`, through `QUOTA_FIELDS` / `KEY_LIMIT_FIELDS`);
- the CLI flags (`weir.tenancy.cli.cli`) and the console's form (`weir.gateway.console`).

Adding a limit: add a field here (with `KEY_LIMIT` if a key may set it), a column on `Quota`
(and `KeyLimit`) in `tenancy/store/models.py`, and a migration.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, TypeAdapter

from weir.tenancy.parsing import parse_with

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MAX_MODELS = 256
MAX_MODEL_NAME = 256


class _KeyLimit:
    """Marks a quota field an API key may set for itself (SLOs and reservations are the tenant's)."""

    def __repr__(self) -> str:
        return "KEY_LIMIT"


KEY_LIMIT = _KeyLimit()


def integral(value: object) -> object:
    # JSON has one number type: 1e6 is an integer, 2.5 is not (strict int refuses it after this).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _no_null_list(value: object) -> object:
    return () if value is None else value  # null models: every model, as absent


def _unique(models: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(models)) != len(models):
        raise ValueError("must not repeat a model")
    return models


Limit64 = Annotated[Annotated[int, Field(ge=1, le=MAX_INT64, strict=True)] | None, BeforeValidator(integral)]
Limit32 = Annotated[Annotated[int, Field(ge=1, le=MAX_INT32, strict=True)] | None, BeforeValidator(integral)]
StorageBytes = Annotated[
    Annotated[int, Field(ge=0, le=MAX_INT64, strict=True)] | None, BeforeValidator(integral)
]  # 0 is a limit here: nothing may be stored
ModelName = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME, strict=True)]
_Models = Annotated[tuple[ModelName, ...], Field(max_length=MAX_MODELS)]
# null is accepted as "every model" (as absent); the schema says so for requests.
ModelList = Annotated[
    _Models,
    AfterValidator(_unique),
    BeforeValidator(_no_null_list, json_schema_input_type=_Models | None),
    Field(json_schema_extra={"uniqueItems": True}),
]


@dataclass(frozen=True)
class QuotaLimits:
    """A tenant's limits; None means unlimited (for a key: its tenant's)."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid", title="QuotaLimits")

    tokens_per_minute: Annotated[
        Limit64, KEY_LIMIT, Field(description="Tokens (prompt + output) per minute.")
    ] = None
    requests_per_minute: Annotated[Limit64, KEY_LIMIT, Field(description="Requests per minute.")] = None
    tokens_per_day: Annotated[Limit64, KEY_LIMIT, Field(description="Tokens per UTC day.")] = None
    max_concurrent: Annotated[Limit32, KEY_LIMIT, Field(description="Requests in flight at once.")] = None
    max_prompt_tokens: Annotated[Limit32, KEY_LIMIT, Field(description="Prompt tokens per request.")] = None
    max_output_tokens: Annotated[Limit32, KEY_LIMIT, Field(description="Output tokens per request.")] = None
    models: Annotated[
        ModelList, KEY_LIMIT, Field(description="Allowed model names; empty: every model.")
    ] = ()
    ttft_slo_ms: Annotated[Limit32, Field(description="Time-to-first-token objective, ms.")] = None
    tpot_slo_ms: Annotated[Limit32, Field(description="Time-per-output-token objective, ms.")] = None
    default_max_tokens_reservation: Annotated[
        Limit32,
        Field(description="Output tokens reserved per sequence for a request without max_tokens; "
              "null: the server's."),
    ] = None  # fmt: skip
    response_storage_bytes: Annotated[
        StorageBytes,
        Field(description="Bytes the tenant's stored /v1/responses answers may hold together (0: storing "
              "refused); null: the server's."),
    ] = None  # fmt: skip
    response_retention_s: Annotated[
        Limit64, Field(description="Seconds a stored /v1/responses answer is kept; null: the server's.")
    ] = None

    def as_dict(self) -> dict[str, object]:
        """Every field by name (None: unlimited), `models` as a list: the admin API's and the audit log's form."""
        return quota_values(self, QUOTA_FIELDS)


def _annotations() -> dict[str, Any]:
    return typing.get_type_hints(QuotaLimits, include_extras=True)


def _is_key_limit(annotation: Any) -> bool:
    return any(meta is KEY_LIMIT for meta in getattr(annotation, "__metadata__", ()))


QUOTA_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(QuotaLimits))
KEY_LIMIT_FIELDS: tuple[str, ...] = tuple(n for n, a in _annotations().items() if _is_key_limit(a))
# The integer limits (every field but `models`), e.g. for a form or CLI flags.
INT_QUOTA_FIELDS: tuple[str, ...] = tuple(n for n in QUOTA_FIELDS if n != "models")


def quota_field_annotation(name: str) -> Any:
    """The annotated type of one field (its pydantic constraints and description)."""
    return _annotations()[name]


def quota_field_description(name: str) -> str:
    """The field's one-line description (for CLI help and the console)."""
    for meta in getattr(quota_field_annotation(name), "__metadata__", ()):
        description = getattr(meta, "description", None)
        if description:
            return str(description)
    return name


def quota_values(quota: object, names: tuple[str, ...]) -> dict[str, object]:
    """`names` read off `quota` (a QuotaLimits or a database row), `models` as a list."""
    return {n: list(v) if isinstance(v := getattr(quota, n), tuple | list) else v for n in names}


def quota_from(source: object, names: tuple[str, ...]) -> QuotaLimits:
    """A QuotaLimits of the fields `names` read off `source` (a row or a namespace); the rest unset."""
    values: dict[str, Any] = {n: getattr(source, n) for n in names}
    if "models" in values:
        values["models"] = tuple(values["models"] or ())
    return QuotaLimits(**values)


QUOTA_ADAPTER: TypeAdapter[QuotaLimits] = TypeAdapter(QuotaLimits)


def parse_quota_limits(body: object, where: str = "quota") -> QuotaLimits:
    """A quota object (absent or null fields: unlimited; `models` absent: every model)."""
    return parse_with(QUOTA_ADAPTER, {} if body is None else body, where)
