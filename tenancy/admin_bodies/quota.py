"""The quota bodies: a tenant's quota (`PUT /admin/v1/tenants/{name}/quota`, `quota` of a tenant)
and a key's own limits (`PUT /admin/v1/keys/{id}/limits`).

Both derive from `weir.tenancy.quota_limits.QuotaLimits`, where each field is declared once: the
tenant's quota validates as that dataclass itself, the key's limits as a model of the fields
marked `KEY_LIMIT` (a key cannot set SLOs or reservations: such a field is refused as unknown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, create_model

from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import (
    KEY_LIMIT_FIELDS,
    QUOTA_ADAPTER,
    QuotaLimits,
    quota_field_annotation,
    quota_from,
)

if TYPE_CHECKING:
    KeyLimitsBody = BaseModel
else:
    KeyLimitsBody = create_model(
        "KeyLimits",
        __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__="An API key's own limits, nested in its tenant's (the tighter applies); null: the tenant's.",
        **{name: (quota_field_annotation(name), getattr(QuotaLimits(), name)) for name in KEY_LIMIT_FIELDS},
    )


def parse_key_limits(body: object) -> QuotaLimits:
    """A key's own limits from decoded JSON (null or absent body: none of its own)."""
    parsed = parse_model(KeyLimitsBody, {} if body is None else body)
    return quota_from(parsed, KEY_LIMIT_FIELDS)


def key_limits_body(limits: QuotaLimits) -> Any:
    """A key's own limits as the admin API shows them (a `KeyLimitsBody`)."""
    return KeyLimitsBody.model_validate(quota_from(limits, KEY_LIMIT_FIELDS), from_attributes=True)


def quota_json(quota: QuotaLimits) -> dict[str, Any]:
    """The quota object, every field present (null: unlimited)."""
    return dict(QUOTA_ADAPTER.dump_python(quota, mode="json"))
