"""Field types shared by the admin bodies: times, names, priorities.

Patterns and bounds come from the module that enforces them on the records
(`weir.tenancy.repository.records`, `weir.tenancy.keys.keys`, `weir.tenancy.catalog.model_version_records`), so the schema and the
checks cannot drift.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
)

from weir.engine.request import Priority
from weir.tenancy.catalog.model_version_records import MODEL_NAME_RE, VERSION_RE
from weir.tenancy.errors import FieldError
from weir.tenancy.keys.keys import PUBLIC_ID_RE
from weir.tenancy.repository.records import CACHE_SCOPE_RE, MAX_WEIGHT
from weir.tenancy.store.field_rules import TENANT_NAME_RE


def time_json(value: dt.datetime | None) -> str | None:
    """A time as the admin API writes it: ISO 8601 in UTC with a trailing Z."""
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _aware_utc(value: object) -> dt.datetime:
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an ISO 8601 time, e.g. 2030-01-01T00:00:00Z") from None
    else:
        raise ValueError("must be an ISO 8601 time string")
    if parsed.tzinfo is None:
        raise ValueError("must include a time zone (e.g. a trailing Z)")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ValueError("must be a time between years 1 and 9999 in UTC") from None


def _date(value: object) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError("must be a date, YYYY-MM-DD")


def parse_date(value: object, field: str) -> dt.date:
    """An ISO date, `YYYY-MM-DD` (a query parameter); `FieldError` naming `field`."""
    try:
        return _date(value)
    except ValueError as exc:
        raise FieldError(field, str(exc)) from None


def parse_datetime(value: object, field: str) -> dt.datetime:
    """An ISO 8601 time with a zone, in UTC (a CLI flag); `FieldError` naming `field`."""
    try:
        return _aware_utc(value)
    except ValueError as exc:
        raise FieldError(field, str(exc)) from None


def _time_out(value: dt.datetime) -> str:
    return str(time_json(value))


# An ISO 8601 time with a zone in, UTC with a trailing Z out.
UtcTime = Annotated[
    dt.datetime,
    PlainValidator(_aware_utc),
    PlainSerializer(_time_out, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
Day = Annotated[
    dt.date,
    PlainValidator(_date),
    PlainSerializer(lambda d: d.isoformat(), return_type=str),
    WithJsonSchema({"type": "string", "format": "date"}),
]


def _priority(value: object) -> Priority:
    if isinstance(value, Priority):
        return value
    if isinstance(value, str) and value.upper() in Priority.__members__:
        return Priority[value.upper()]
    raise ValueError(f"must be one of {', '.join(p.name.lower() for p in Priority)}")


PriorityName = Annotated[
    Priority,
    PlainValidator(_priority),
    PlainSerializer(lambda p: p.name.lower(), return_type=str),
    WithJsonSchema({"type": "string", "enum": [p.name.lower() for p in Priority]}),
]


def _finite_number(value: object) -> object:
    # A JSON number: not a bool, not a string (pydantic's lax float would take "1.5").
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


Weight = Annotated[float, BeforeValidator(_finite_number), Field(gt=0, le=MAX_WEIGHT, allow_inf_nan=False)]
TenantName = Annotated[str, Field(strict=True, pattern=f"^{TENANT_NAME_RE.pattern}$")]
CacheScope = Annotated[str, Field(strict=True, pattern=f"^{CACHE_SCOPE_RE.pattern}$")]
KeyId = Annotated[str, Field(strict=True, pattern=f"^{PUBLIC_ID_RE.pattern}$")]
ModelName = Annotated[str, Field(strict=True, pattern=f"^{MODEL_NAME_RE.pattern}$")]
VersionLabel = Annotated[str, Field(strict=True, pattern=f"^{VERSION_RE.pattern}$")]

# An optional filter in a query string (`?model_version=`, `?model=`, `?tenant=`): 1 to this many
# characters; an empty or longer value is refused naming the parameter.
MAX_QUERY_LEN = 256
