"""Keys as principals: per-key limits, requests-per-minute limits, shared buckets, `user` on usage.

Revision ID: 0006
Revises: 0005
Create Date: 2026-01-06

- `quotas.requests_per_minute`: a tenant's requests-per-minute limit (NULL: unlimited).
- `key_limits`: an API key's own limits, nested in its tenant's (no row: none of its own).
- `principal_buckets`: shared budgets leased by the replicas for keys and request counts
  (the tenant's token budget keeps its `budget_buckets` row).
- `usage_records.user`: the request's `user` field (NULL for records written before).

Only additions: existing rows are untouched on the way up, and the way down drops only what
this revision added. Self-contained on purpose (see 0001): the schema of its time, no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        batch.add_column(sa.Column("requests_per_minute", sa.BigInteger(), nullable=True))
    op.create_table(
        "key_limits",
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("requests_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("max_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("max_output_tokens", sa.Integer(), nullable=True),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_key_limits_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_key_limits")),
    )
    op.create_table(
        "principal_buckets",
        sa.Column("subject", sa.String(length=96), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.Float(), nullable=False),
        sa.Column("day", sa.Integer(), nullable=False),
        sa.Column("day_used", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_principal_buckets")),
    )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("user", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("user")
    op.drop_table("principal_buckets")
    op.drop_table("key_limits")
    with op.batch_alter_table("quotas") as batch:
        batch.drop_column("requests_per_minute")
