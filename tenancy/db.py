"""Database engine and sessions for the tenancy store (SQLite by default, or PostgreSQL).

Sessions are synchronous: the gateway calls the repository through a thread pool, and the
auth cache keeps the database off the hot path.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

SQLITE_FILENAME = "weir.db"


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
    # SQLite ignores foreign keys unless asked, per connection.
    cursor.execute("PRAGMA foreign_keys=ON")
    # Readers (auth lookups) do not block the writer (usage records) and vice versa.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


class Database:
    """An SQLAlchemy engine plus a session factory for one database URL."""

    def __init__(self, url: str | URL, *, echo: bool = False) -> None:
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
        # expire_on_commit=False: views are built after commit without reloading rows.
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Database({safe_url(self.url)!r})"

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.url.get_backend_name()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on any error."""
        with self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
