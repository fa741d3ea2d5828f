"""Usage records are unique per (request id, tenant): a record replayed from the spool is stored once.

Revision ID: 0003
Revises: 0002
Create Date: 2026-01-03

The usage writer spools every record to local disk before writing it, and replays the spool
after a database outage or a crash; the unique index makes that replay idempotent (the insert
skips a record already stored). It replaces the plain index on request_id, which it also serves
(request_id leads). Self-contained on purpose (see 0001): the schema of its time, no model imports.
A database holding duplicate (request_id, tenant_id) pairs cannot take this index: Weir's request
ids are server-made UUIDs, so only hand-written rows could collide; remove them first.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ux_usage_records_request_tenant", "usage_records", ["request_id", "tenant_id"], unique=True
    )
    op.drop_index(op.f("ix_usage_records_request_id"), table_name="usage_records")


def downgrade() -> None:
    op.create_index(op.f("ix_usage_records_request_id"), "usage_records", ["request_id"], unique=False)
    op.drop_index("ux_usage_records_request_tenant", table_name="usage_records")
