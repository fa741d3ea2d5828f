"""Prices, spend on usage records, and budgets over windows (issue 25, items 2 and 3).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

- `model_prices`: prices per model version (or model), per million tokens, in micro-units of a
  currency, each effective from a time. Rows are only ever added.
- `usage_records.spend_micros`, `.currency`, `.price_id`: the spend of each record (NULL for
  records written before this revision, and for models without a price).
- `window_budgets` and `window_budget_usage`: token and money budgets of tenants and keys over
  minute, hour, day, month or rolling windows, and what each bucket of a window counted.

Only additions: existing rows are untouched on the way up, and the way down drops only what
this revision added. Self-contained on purpose (see 0001): the schema of its time, no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "model_prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=193), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("input_micros", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros", sa.BigInteger(), nullable=False),
        sa.Column("output_micros", sa.BigInteger(), nullable=False),
        sa.Column("effective_from", _utc(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_prices")),
        sa.UniqueConstraint("model", "effective_from", name=op.f("uq_model_prices_model")),
    )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("spend_micros", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("currency", sa.String(length=3), nullable=True))
        batch.add_column(sa.Column("price_id", sa.Integer(), nullable=True))
    op.create_table(
        "window_budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("window", sa.String(length=16), nullable=False),
        sa.Column("time_zone", sa.String(length=64), nullable=False),
        sa.Column("rolling_s", sa.Integer(), nullable=True),
        sa.Column("soft_limit", sa.BigInteger(), nullable=True),
        sa.Column("hard_limit", sa.BigInteger(), nullable=True),
        sa.Column("soft_alerted_at", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_window_budgets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_window_budgets_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_window_budgets")),
    )
    op.create_index(op.f("ix_window_budgets_tenant_id"), "window_budgets", ["tenant_id"])
    op.create_table(
        "window_budget_usage",
        sa.Column("budget_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", sa.BigInteger(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["budget_id"],
            ["window_budgets.id"],
            name=op.f("fk_window_budget_usage_budget_id_window_budgets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("budget_id", "bucket_start", name=op.f("pk_window_budget_usage")),
    )


def downgrade() -> None:
    op.drop_table("window_budget_usage")
    op.drop_index(op.f("ix_window_budgets_tenant_id"), table_name="window_budgets")
    op.drop_table("window_budgets")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("price_id")
        batch.drop_column("currency")
        batch.drop_column("spend_micros")
    op.drop_table("model_prices")
