"""Stored responses of `POST /v1/responses` (issue 57): per tenant, counted and expiring.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

- `stored_responses`: the response object as answered (`body`), the conversation items that made
  its prompt (`input_items`), its size in bytes (the tenant's storage quota counts them), and
  when it expires (the retention period). Deleted with the tenant (ON DELETE CASCADE).

Self-contained on purpose (see 0001): no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("num_bytes", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_stored_responses_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stored_responses")),
    )
    op.create_index(
        "ix_stored_responses_tenant_expires", "stored_responses", ["tenant_id", "expires_at"], unique=False
    )
    op.create_index(op.f("ix_stored_responses_expires_at"), "stored_responses", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_stored_responses_expires_at"), table_name="stored_responses")
    op.drop_index("ix_stored_responses_tenant_expires", table_name="stored_responses")
    op.drop_table("stored_responses")
