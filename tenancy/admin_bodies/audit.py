"""The audit log's answer (`GET /admin/v1/audit`): admin actions, newest first."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.admin_bodies.fields import UtcTime
from weir.tenancy.store.enums import AuditAction


class AuditEvent(BaseModel):
    """One admin action as recorded."""

    # model_validate(event) of a `weir.tenancy.store.audit.AuditEventView`.
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    object: Literal["audit_event"] = "audit_event"
    id: int
    created_at: UtcTime
    actor: str
    action: AuditAction
    tenant: str | None
    target: str | None
    # Free-form by action (e.g. a quota's previous and new limits), as the repository wrote it.
    details: dict[str, Any] = Field(description="What changed; its fields depend on the action.")


class AuditList(BaseModel):
    """`GET /admin/v1/audit`."""

    object: Literal["list"] = "list"
    data: list[AuditEvent]
