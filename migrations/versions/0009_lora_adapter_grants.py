"""LoRA adapter access lists: the tenants (besides its owner) an adapter is granted to.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

An adapter with no owner and no grant stays public; one with grants is callable only by its
owner and the granted tenants (issue 28). Self-contained on purpose (see 0001): no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lora_adapter_grants",
        sa.Column("adapter_id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["lora_adapters.id"], name=op.f("fk_lora_adapter_grants_adapter_id_lora_adapters")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_lora_adapter_grants_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("adapter_id", "tenant_id", name=op.f("pk_lora_adapter_grants")),
    )


def downgrade() -> None:
    op.drop_table("lora_adapter_grants")
