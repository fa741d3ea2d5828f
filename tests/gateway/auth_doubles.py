"""Test doubles for the authentication tests: clocks moved together, a repository that counts
lookups, and a migrated SQLite repository to hand to the fixtures of test_auth*.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from weir.engine.request import Priority
from weir.migrations.migrate import upgrade
from weir.tenancy.context import QuotaLimits
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import KeyRecord, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
ADDR = "203.0.113.7"
ACME = TenantSpec("acme", Priority.INTERACTIVE, weight=2.0, quota=QuotaLimits(max_concurrent=8))
GLOBEX = TenantSpec("globex")


class Clocks:
    """A wall clock for the repository and a monotonic timer for caches, moved together."""

    def __init__(self) -> None:
        self.now = START
        self.t = 1000.0

    def wall(self) -> dt.datetime:
        return self.now

    def timer(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.t += seconds


class CountingRepo(TenancyRepo):
    """Counts database lookups, to show the cache keeps them off the hot path."""

    lookups = 0
    id_scans = 0  # reads of the set of every key id

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        self.lookups += 1
        return super().lookup_key(key_id, timeout_s=timeout_s)

    def key_ids(self, *, timeout_s: float | None = None) -> frozenset[str]:
        self.id_scans += 1
        return super().key_ids(timeout_s=timeout_s)


R = TypeVar("R", bound=TenancyRepo)


@contextmanager
def open_repo(repo_type: type[R], path: Path, clocks: Clocks, *tenants: TenantSpec) -> Iterator[R]:
    """A repository of `repo_type` over a migrated SQLite database at `path`, holding `tenants`."""
    db = Database(f"sqlite:///{path}")
    upgrade(db.engine)
    repo = repo_type(db, KeyHasher(b"pepper"), clock=clocks.wall)
    for spec in tenants:
        repo.create_tenant(spec, actor="t")
    try:
        yield repo
    finally:
        db.dispose()


def bearer(key: str) -> str:
    return f"Bearer {key}"
