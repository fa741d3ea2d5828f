"""A tenant's stored responses as the admin sees them (`GET /admin/v1/tenants/{name}/stored-responses`):
what they hold against the storage quota, and how long they are kept (`weir.tenancy.responses`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.admin_bodies.fields import TenantName


class StoredResponsesView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: TenantName
    bytes_used: int = Field(description="bytes the tenant's unexpired stored responses hold (their JSON)")
    quota_bytes: int = Field(
        description="the most they may hold together: the tenant's quota response_storage_bytes, else "
        "--response-storage-bytes"
    )
    retention_s: float = Field(
        description="how long a stored response is kept: the tenant's quota response_retention_s, else "
        "--response-retention-s"
    )
