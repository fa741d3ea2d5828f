"""The audit log: one event per admin action, written in the same transaction as the action.

Details hold what changed (field names and new values), never a secret or a key hash.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from weir.tenancy.errors import FieldError
from weir.tenancy.store.enums import AuditAction
from weir.tenancy.store.models import AuditEvent

MAX_AUDIT_PAGE = 1000
# Field names whose values must never reach the log, even by mistake.
_FORBIDDEN_DETAIL_KEYS = frozenset({"key", "secret", "secret_hash", "token", "token_hash", "password"})


@dataclass(frozen=True)
class AuditEventView:
    """One admin action as recorded."""

    id: int
    created_at: dt.datetime
    actor: str
    action: AuditAction
    tenant: str | None
    target: str | None
    details: dict[str, object]


@dataclass(frozen=True)
class AuditTrail:
    """Who acts, and when, in one transaction: each `record` adds an event to that transaction,
    so it commits or rolls back with the action it describes."""

    session: Session
    when: dt.datetime
    actor: str

    def record(
        self,
        action: AuditAction,
        *,
        tenant: str | None = None,
        target: str | None = None,
        details: Mapping[str, object] | None = None,
    ) -> None:
        """Add one event; `ValueError` if its details name a secret."""
        payload = dict(details or {})
        leaked = _FORBIDDEN_DETAIL_KEYS.intersection(payload)
        if leaked:
            raise ValueError(f"audit details must not contain secrets: {sorted(leaked)}")
        self.session.add(
            AuditEvent(
                created_at=self.when,
                actor=self.actor[:128],
                action=action,
                tenant=tenant,
                target=target,
                details=payload,
            )
        )


def list_events(
    session: Session, *, tenant: str | None = None, limit: int = 100, before_id: int | None = None
) -> list[AuditEventView]:
    """Newest first; page with `before_id` (the smallest id of the previous page)."""
    if not 1 <= limit <= MAX_AUDIT_PAGE:
        raise FieldError("limit", f"must be between 1 and {MAX_AUDIT_PAGE}")
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(AuditEvent.tenant == tenant)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    return [
        AuditEventView(
            id=row.id,
            created_at=row.created_at,
            actor=row.actor,
            action=row.action,
            tenant=row.tenant,
            target=row.target,
            details=dict(row.details),
        )
        for row in session.scalars(query)
    ]
