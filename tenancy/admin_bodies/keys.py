"""API key bodies: issue (`POST /admin/v1/tenants/{name}/keys`), a key's own limits
(`PUT /admin/v1/keys/{id}/limits`, in `weir.tenancy.admin_bodies.quota`) and the key object the key
routes answer (never the secret, except once in `IssuedApiKey`)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.admin_bodies.fields import KeyId, TenantName, UtcTime
from weir.tenancy.admin_bodies.quota import KeyLimitsBody, key_limits_body
from weir.tenancy.repository.records import ApiKeyView, IssuedKey, KeySpec
from weir.tenancy.store.enums import KeyScope, KeyState

Scopes = Annotated[list[KeyScope], Field(min_length=1, json_schema_extra={"uniqueItems": True})]


class KeyCreate(BaseModel):
    """Both optional: every scope, no expiry."""

    # model_validate(spec): the request body of a `KeySpec` (what the CLI sends).
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    scopes: Scopes | None = None
    expires_at: UtcTime | None = Field(default=None, description="In the future.")

    def spec(self) -> KeySpec:
        """The repository's input."""
        scopes = tuple(KeyScope) if self.scopes is None else tuple(self.scopes)
        return KeySpec(scopes=scopes, expires_at=self.expires_at)


class ApiKey(BaseModel):
    """A key's metadata and its own limits; never the secret."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["api_key"] = "api_key"
    id: KeyId
    prefix: str
    tenant: TenantName
    scopes: list[KeyScope]
    state: KeyState
    created_at: UtcTime
    expires_at: UtcTime | None
    revoked_at: UtcTime | None
    last_used_at: UtcTime | None
    limits: KeyLimitsBody

    @classmethod
    def of(cls, key: ApiKeyView, now: dt.datetime) -> ApiKey:
        return cls(
            id=key.id,
            prefix=key.prefix,
            tenant=key.tenant,
            scopes=list(key.scopes),
            state=key.state(now),
            created_at=key.created_at,
            expires_at=key.expires_at,
            revoked_at=key.revoked_at,
            last_used_at=key.last_used_at,
            limits=key_limits_body(key.limits),
        )


class IssuedApiKey(ApiKey):
    """A new key with its secret in `key`: the only answer that carries a secret (shown once)."""

    key: str

    @classmethod
    def issued(cls, issued: IssuedKey, now: dt.datetime) -> IssuedApiKey:
        return cls(**dict(ApiKey.of(issued.view, now)), key=issued.key)


class ApiKeyList(BaseModel):
    """`GET /admin/v1/tenants/{name}/keys`."""

    object: Literal["list"] = "list"
    data: list[ApiKey]
