"""weir.tenancy.store.db: per-transaction lock timeouts on SQLite, and their reset for the next user."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from weir.migrations.migrate import upgrade
from weir.tenancy.store.db import DEFAULT_BUSY_TIMEOUT_MS, Database


def _busy_timeout(db: Database) -> int:
    with db.transaction() as session:
        return int(session.execute(text("PRAGMA busy_timeout")).scalar_one())


def test_a_transaction_timeout_applies_to_that_transaction_only(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}")
    upgrade(db.engine)
    with db.transaction(timeout_s=0.25) as session:
        assert session.execute(text("PRAGMA busy_timeout")).scalar_one() == 250
    assert _busy_timeout(db) == DEFAULT_BUSY_TIMEOUT_MS  # the pooled connection is reset
    db.dispose()
    db = Database(f"sqlite:///{tmp_path / 'weir.db'}", busy_timeout_ms=300)
    assert _busy_timeout(db) == 300
    db.dispose()


def test_a_write_on_a_locked_database_fails_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "weir.db"
    db = Database(f"sqlite:///{path}")
    upgrade(db.engine)
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(OperationalError, match="locked"):
            with db.transaction(timeout_s=0.05) as session:
                session.execute(text("UPDATE tenants SET weight = weight"))
        with db.transaction(timeout_s=0.05) as session:  # WAL: readers are not blocked
            assert session.execute(text("SELECT count(*) FROM tenants")).scalar_one() == 0
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        db.dispose()
