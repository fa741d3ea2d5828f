"""LoRA adapters: registered adapters of a base model version, with owner and state, and the
adapter each usage record ran through.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Per-tenant LoRA adapters (issue 28). `usage_records.adapter` is NULL for the base model and for
rows written before this revision. Self-contained on purpose (see 0001): no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lora_adapters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("model_version", sa.String(length=193), nullable=False),
        sa.Column("path", sa.String(length=4096), nullable=False),
        sa.Column("owner_tenant_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("failure_reason", sa.String(length=2000), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_tenant_id"], ["tenants.id"], name=op.f("fk_lora_adapters_owner_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lora_adapters")),
        sa.UniqueConstraint("name", name=op.f("uq_lora_adapters_name")),
    )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("adapter", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("adapter")
    op.drop_table("lora_adapters")
