"""Per-day rollups of the usage records, kept by the database in the writing transaction.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

- `usage_daily`: per (tenant, UTC day, key, model, model version, adapter, currency) the sums of
  the usage records: requests by status, prompt/completion/cached tokens, spend, unpriced records.
- `usage_daily_users`: the same, also per `user` (larger; read only when a report groups by user).

A nullable dimension is stored as '' with its bit set in `null_mask` (key_id 1, model_version 2,
adapter 4, currency 8, user 16): a primary key cannot hold NULL, and `user` may be '' itself.

Triggers on `usage_records` keep both exact in the transaction that writes a record: an insert
adds the record, an update (a stream's later record replacing its provisional one) subtracts the
old row and adds the new one, a delete subtracts. SQLite: row triggers. PostgreSQL: statement
triggers over the transition tables, one grouped upsert per statement in key order (a batch of
records touches each rollup row once; concurrent writers lock rollup rows in one order). Rows
whose sums drop to 0 stay (requests = 0); readers skip them.

The upgrade backfills both from the existing records (writers wait for it). Self-contained on purpose (see 0001).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = {"usage_daily": False, "usage_daily_users": True}  # name -> keyed by user too
# The nullable dimensions, their bit in null_mask, and their length.
_NULLABLE = (("key_id", 1, 32), ("model_version", 2, 193), ("adapter", 4, 128), ("currency", 8, 3))
_USER = ("user", 16, 256)
_MEASURES = (
    "requests",
    "completed",
    "failed",
    "cancelled",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "spend_micros",
    "unpriced",
)
_RECORD_COLUMNS = (
    "tenant_id",
    "day",
    "key_id",
    "model",
    "model_version",
    "adapter",
    "currency",
    "user",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "spend_micros",
)


def _nullable(with_user: bool) -> tuple[tuple[str, int, int], ...]:
    return (*_NULLABLE, _USER) if with_user else _NULLABLE


def _key_columns(with_user: bool) -> list[str]:
    return ["tenant_id", "day", "model", *(name for name, _, _ in _nullable(with_user)), "null_mask"]


def _q(name: str) -> str:
    return f'"{name}"'  # `user` is a reserved word in PostgreSQL


def rollup_upsert(table: str, with_user: bool, source: str) -> str:
    """Add the rows of `source` (record columns and a `sign`, +1 or -1) to `table`, grouped."""
    nullable = _nullable(with_user)
    keys = [
        "r.tenant_id",
        "r.day",
        "r.model",
        *(f"COALESCE(r.{_q(name)}, '')" for name, _, _ in nullable),
        " + ".join(f"(CASE WHEN r.{_q(name)} IS NULL THEN {bit} ELSE 0 END)" for name, bit, _ in nullable),
    ]
    measures = [
        "SUM(r.sign)",
        "SUM(CASE WHEN r.status = 'completed' THEN r.sign ELSE 0 END)",
        "SUM(CASE WHEN r.status = 'failed' THEN r.sign ELSE 0 END)",
        "SUM(CASE WHEN r.status = 'cancelled' THEN r.sign ELSE 0 END)",
        "SUM(r.sign * r.prompt_tokens)",
        "SUM(r.sign * r.completion_tokens)",
        "SUM(r.sign * r.cached_tokens)",
        "SUM(r.sign * COALESCE(r.spend_micros, 0))",
        "SUM(CASE WHEN r.spend_micros IS NULL THEN r.sign ELSE 0 END)",
    ]
    key_columns = ", ".join(_q(c) for c in _key_columns(with_user))
    positions = ", ".join(str(i + 1) for i in range(len(keys)))
    updates = ", ".join(f"{m} = {table}.{m} + excluded.{m}" for m in _MEASURES)
    # `WHERE true`: SQLite's parser needs it before ON CONFLICT in an INSERT ... SELECT.
    return (
        f"INSERT INTO {table} ({key_columns}, {', '.join(_MEASURES)}) "
        f"SELECT {', '.join(keys)}, {', '.join(measures)} FROM ({source}) AS r WHERE true "
        f"GROUP BY {positions} ORDER BY {positions} "
        f"ON CONFLICT ({key_columns}) DO UPDATE SET {updates}"
    )


def _rows(relation: str, sign: int) -> str:
    columns = ", ".join(_q(c) for c in _RECORD_COLUMNS)
    return f"SELECT {columns}, {sign} AS sign FROM {relation}"


def _row(alias: str, sign: int) -> str:
    """One trigger row (SQLite's NEW or OLD) as a one-row SELECT."""
    columns = ", ".join(f"{alias}.{_q(c)} AS {_q(c)}" for c in _RECORD_COLUMNS)
    return f"SELECT {columns}, {sign} AS sign"


# event -> the (row or transition table, sign) pairs it applies
_EVENTS = {
    "insert": (("NEW", "new_rows", 1),),
    "update": (("OLD", "old_rows", -1), ("NEW", "new_rows", 1)),
    "delete": (("OLD", "old_rows", -1),),
}


def _create_sqlite_triggers() -> None:
    for event, parts in _EVENTS.items():
        body = "; ".join(
            rollup_upsert(table, with_user, " UNION ALL ".join(_row(alias, sign) for alias, _, sign in parts))
            for table, with_user in TABLES.items()
        )
        op.execute(
            f"CREATE TRIGGER usage_rollup_{event} AFTER {event.upper()} ON usage_records "
            f"FOR EACH ROW BEGIN {body}; END"
        )


def _create_postgresql_triggers() -> None:
    for event, parts in _EVENTS.items():
        source = " UNION ALL ".join(_rows(relation, sign) for _, relation, sign in parts)
        body = "; ".join(rollup_upsert(table, with_user, source) for table, with_user in TABLES.items())
        op.execute(
            f"CREATE FUNCTION usage_rollup_{event}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {body}; RETURN NULL; END $$"
        )
        referencing = " ".join(
            f"{relation.split('_')[0].upper()} TABLE AS {relation}" for _, relation, _ in parts
        )
        op.execute(
            f"CREATE TRIGGER usage_rollup_{event} AFTER {event.upper()} ON usage_records "
            f"REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION usage_rollup_{event}()"
        )


def upgrade() -> None:
    for table, with_user in TABLES.items():
        dims = [
            sa.Column("tenant_id", sa.Integer(), nullable=False),
            sa.Column("day", sa.Date(), nullable=False),
            sa.Column("model", sa.String(length=256), nullable=False),
            *(sa.Column(name, sa.String(length=n), nullable=False) for name, _, n in _nullable(with_user)),
            sa.Column("null_mask", sa.Integer(), nullable=False),
        ]
        op.create_table(
            table,
            *dims,
            *(sa.Column(m, sa.BigInteger(), nullable=False) for m in _MEASURES),
            sa.PrimaryKeyConstraint(*_key_columns(with_user), name=op.f(f"pk_{table}")),
        )
    if op.get_bind().dialect.name == "postgresql":
        # No record may be written between the backfill's snapshot and the triggers: writers wait
        # for this transaction (readers do not). SQLite's write lock does the same.
        op.execute("LOCK TABLE usage_records IN SHARE ROW EXCLUSIVE MODE")
    for table, with_user in TABLES.items():  # the backfill, before the triggers exist
        op.execute(rollup_upsert(table, with_user, _rows("usage_records", 1)))
    if op.get_bind().dialect.name == "postgresql":
        _create_postgresql_triggers()
    else:
        _create_sqlite_triggers()


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for event in _EVENTS:
        op.execute(
            f"DROP TRIGGER usage_rollup_{event} ON usage_records"
            if postgresql
            else f"DROP TRIGGER usage_rollup_{event}"
        )
        if postgresql:
            op.execute(f"DROP FUNCTION usage_rollup_{event}()")
    for table in TABLES:
        op.drop_table(table)
