"""Quotas: a per-tenant storage quota and retention for stored /v1/responses answers (issue 57).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

- `quotas.response_storage_bytes`: bytes the tenant's stored responses may hold together (0:
  storing refused); NULL: the server's `--response-storage-bytes`.
- `quotas.response_retention_s`: seconds a stored response is kept; NULL: the server's
  `--response-retention-s`.

Plain ALTER TABLE on both backends (nullable columns, no rebuild). Self-contained on purpose
(see 0001): no model imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("quotas", sa.Column("response_storage_bytes", sa.BigInteger(), nullable=True))
    op.add_column("quotas", sa.Column("response_retention_s", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("quotas", "response_retention_s")
    op.drop_column("quotas", "response_storage_bytes")
