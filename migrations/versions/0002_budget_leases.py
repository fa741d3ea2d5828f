"""Shared token budgets: one bucket row per tenant, leased in chunks by the replicas.

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-02

Self-contained on purpose (see 0001): the schema of its time, no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "budget_buckets",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.Float(), nullable=False),
        sa.Column("day", sa.Integer(), nullable=False),
        sa.Column("day_used", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_budget_buckets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_budget_buckets")),
    )


def downgrade() -> None:
    op.drop_table("budget_buckets")
