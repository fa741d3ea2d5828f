"""Model versions: registered versions with their state, each model name's traffic plan, and
the version that served each usage record.

Revision ID: 0005
Revises: 0004
Create Date: 2026-01-05

Several versions of a model are served side by side and rolled out by a traffic plan (issue 12).
`usage_records.model_version` is NULL for rows written before this revision. Self-contained on
purpose (see 0001): the schema of its time, no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=4096), nullable=False),
        sa.Column("tokenizer", sa.String(length=4096), nullable=True),
        sa.Column("dtype", sa.String(length=16), nullable=True),
        sa.Column("kv_cache_tokens", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("failure_reason", sa.String(length=2000), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_model_versions_name")),
    )
    op.create_table(
        "model_traffic",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("split", sa.JSON(), nullable=False),
        sa.Column("pins", sa.JSON(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_model_traffic")),
    )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("model_version", sa.String(length=193), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("model_version")
    op.drop_table("model_traffic")
    op.drop_table("model_versions")
