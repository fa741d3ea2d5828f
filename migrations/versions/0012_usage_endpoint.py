"""The endpoint of each usage record (issue 57): which API a request came through.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07

- `usage_records.endpoint`: `chat.completion`, `text_completion`, `message` (Anthropic's
  Messages), `response` (OpenAI's Responses) or `tokenize`; NULL for records written before 0012.
  Added and dropped with plain ALTER TABLE on both backends: a batch rebuild of the table on
  SQLite would drop the usage rollup triggers of 0010.

Self-contained on purpose (see 0001): no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("endpoint", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE usage_records DROP COLUMN endpoint")
