"""The admin API's body for an API key's own limits (`PUT /admin/v1/keys/{id}/limits`).

Declared once as a pydantic model: validation, the OpenAPI schema and the conversion to
`QuotaLimits` derive from it. Absent or null fields mean "the tenant's limit"; an empty or absent
`models` means "the tenant's models". A key can only narrow its tenant: the tighter applies.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tenancy.context import QuotaLimits
from tenancy.errors import FieldError

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MAX_MODELS = 256

Limit64 = Annotated[int | None, Field(default=None, ge=1, le=MAX_INT64, strict=True)]
Limit32 = Annotated[int | None, Field(default=None, ge=1, le=MAX_INT32, strict=True)]
ModelName = Annotated[str, Field(min_length=1, max_length=256)]


class KeyLimitsBody(BaseModel):
    """An API key's own limits; each one null (the tenant's) or at least 1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: Limit64 = None
    tokens_per_minute: Limit64 = None
    tokens_per_day: Limit64 = None
    max_concurrent: Limit32 = None
    max_prompt_tokens: Limit32 = None
    max_output_tokens: Limit32 = None
    models: Annotated[list[ModelName] | None, Field(default=None, max_length=MAX_MODELS)] = None

    def limits(self) -> QuotaLimits:
        """The key's limits as the gateway and the repository carry them."""
        return QuotaLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            tokens_per_day=self.tokens_per_day,
            max_concurrent=self.max_concurrent,
            max_prompt_tokens=self.max_prompt_tokens,
            max_output_tokens=self.max_output_tokens,
            models=tuple(self.models or ()),
        )


def parse_key_limits(body: object) -> QuotaLimits:
    """A `KeyLimitsBody` from decoded JSON; the first problem as a `FieldError` (a 400)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    try:
        parsed = KeyLimitsBody.model_validate(body)
    except ValidationError as exc:
        error: Any = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in error.get("loc", ())) or "body"
        raise FieldError(where, str(error.get("msg", "is invalid"))) from None
    return parsed.limits()


def key_limits_schema() -> dict[str, Any]:
    """The body's JSON Schema, for `/admin/openapi.json`."""
    return KeyLimitsBody.model_json_schema()
