"""Quotas: a per-tenant reservation for requests without max_tokens.

Revision ID: 0004
Revises: 0003
Create Date: 2026-01-04

A chat request without max_tokens may generate up to the whole context; admission reserves a
bounded default for it instead (the server's `--default-max-tokens-reservation`, or this column
when set) and charges any overshoot as debt. NULL: the server's default. Self-contained on
purpose (see 0001): the schema of its time, no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        batch.add_column(sa.Column("default_max_tokens_reservation", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        batch.drop_column("default_max_tokens_reservation")
