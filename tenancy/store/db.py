"""Database engine and sessions for the tenancy store (SQLite by default, or PostgreSQL).

Sessions are synchronous: the gateway calls the repository through a thread pool, and the
auth cache keeps the database off the hot path.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

SQLITE_FILENAME = "weir.db"
# How long an SQLite statement waits for a lock before "database is locked" (writers queue here).
DEFAULT_BUSY_TIMEOUT_MS = 5000
_CONNECT_BUSY_TIMEOUT_MS = 1000


def utc_now() -> dt.datetime:
    """The current time as an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


def sqlite_url_for(data_dir: Path) -> str:
    """The URL of the embedded default database inside a data directory."""
    return f"sqlite:///{(data_dir / SQLITE_FILENAME).resolve()}"


def safe_url(url: str | URL) -> str:
    """A URL fit for messages and logs: the password is masked."""
    return make_url(url).render_as_string(hide_password=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    # Opening a connection on a locked file fails within this, not sqlite3's default 5 s: auth
    # lookups on a fresh connection must stay bounded. Each checkout then sets the pool's default.
    cursor.execute(f"PRAGMA busy_timeout={_CONNECT_BUSY_TIMEOUT_MS}")
    # SQLite ignores foreign keys unless asked, per connection.
    cursor.execute("PRAGMA foreign_keys=ON")
    # Readers (auth lookups) do not block the writer (usage records) and vice versa.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _sqlite_busy_timeout(busy_timeout_ms: int) -> Callable[[Any, Any, Any], None]:
    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # A transaction may have shortened the busy timeout (`Database.transaction(timeout_s=...)`);
        # every checkout starts again from the default, whatever happened to the last user.
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")

    return on_checkout


class Database:
    """An SQLAlchemy engine plus a session factory for one database URL."""

    def __init__(
        self, url: str | URL, *, echo: bool = False, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> None:
        """`busy_timeout_ms`: how long an SQLite statement waits for a lock by default."""
        parsed = make_url(url)
        self.url = parsed
        kwargs: dict[str, Any] = {"echo": echo}
        if parsed.get_backend_name() == "sqlite":
            database = parsed.database
            if database and database != ":memory:" and not database.startswith("file:"):
                # `weir db upgrade` on a fresh data dir should just work.
                Path(database).parent.mkdir(parents=True, exist_ok=True)
        else:
            kwargs["pool_pre_ping"] = True  # survive server restarts and idle-connection reaping
        self.engine: Engine = create_engine(parsed, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "checkout", _sqlite_busy_timeout(busy_timeout_ms))
        # expire_on_commit=False: views are built after commit without reloading rows.
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Database({safe_url(self.url)!r})"

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.url.get_backend_name()

    @contextmanager
    def transaction(self, *, timeout_s: float | None = None) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on any error.

        `timeout_s` bounds how long each statement may wait for a lock (SQLite's busy timeout;
        PostgreSQL's lock and statement timeouts) before it fails with an OperationalError; None
        keeps the default (5 s on SQLite). Callers on a request path pass a short one.
        """
        with self._sessions() as session, session.begin():
            if timeout_s is not None:
                self._set_timeout(session, timeout_s)
            yield session

    def _set_timeout(self, session: Session, timeout_s: float) -> None:
        ms = max(1, round(timeout_s * 1000))
        connection = session.connection()
        if self.backend == "sqlite":
            connection.exec_driver_sql(f"PRAGMA busy_timeout={ms}")  # reset at the next checkout
        elif self.backend == "postgresql":
            # SET LOCAL ends with the transaction.
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
            connection.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
