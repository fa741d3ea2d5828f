"""Database fixtures for the tenancy tests, parametrized over SQLite and PostgreSQL.

PostgreSQL runs when WEIR_TEST_PG_URL is set (by .ci/postgres.sh); each test gets its own
schema there, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tests.tenancy.clock import FakeClock
from weir.migrations.migrate import upgrade
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

PG_ENV = "WEIR_TEST_PG_URL"
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'weir.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set (source .ci/postgres.sh)")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = Database(base)
    with admin.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with admin.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    db = Database(db_url)
    yield db
    db.dispose()


@pytest.fixture
def migrated(database: Database) -> Database:
    upgrade(database.engine)
    return database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hasher() -> KeyHasher:
    return KeyHasher(b"test-pepper")


@pytest.fixture
def repo(migrated: Database, hasher: KeyHasher, clock: FakeClock) -> TenancyRepo:
    return TenancyRepo(migrated, hasher, clock=clock)
