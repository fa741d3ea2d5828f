"""Stored responses in the database (SQLite and PostgreSQL): per tenant, counted, expiring,
deleted with the tenant, stored one at a time or in batches (one transaction, an unknown tenant
failing alone); and the same contract kept by the in-memory store."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from tests.tenancy.clock import START
from weir.tenancy.errors import TenantNotFoundError
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.responses import response_repo
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import ResponseStorageLimits, ResponseStore, StoredResponse
from weir.tenancy.responses.response_repo import DatabaseResponseStore
from weir.tenancy.store.models import StoredResponse as StoredResponseRow
from weir.tenancy.store.models import Tenant

DAY = dt.timedelta(days=1)


def _record(response_id: str, text: str = "hello", *, created: dt.datetime = START) -> StoredResponse:
    body = {"id": response_id, "object": "response", "output": [{"type": "message", "text": text}]}
    items = ({"type": "message", "role": "user", "content": "héllo"},)
    return StoredResponse(response_id, body, items, created, created + DAY)


@pytest.fixture(params=["database", "memory"])
def store(request: pytest.FixtureRequest, repo: TenancyRepo) -> ResponseStore:
    for name in ("acme", "globex"):
        repo.create_tenant(TenantSpec(name=name), actor="test")
    if request.param == "memory":
        return MemoryResponseStore()
    return DatabaseResponseStore(repo.db)


def test_put_get_delete_per_tenant(store: ResponseStore) -> None:
    record = _record("resp_1")
    store.put("acme", record)
    got = store.get("acme", "resp_1", START)
    assert got is not None and got.body == record.body and got.input_items == record.input_items
    assert got.num_bytes == record.num_bytes
    # Another tenant's id is the same as an unknown one, for reads and deletes.
    assert store.get("globex", "resp_1", START) is None
    assert store.delete("globex", "resp_1") is False
    assert store.get("acme", "resp_1", START) is not None
    assert store.bytes_used("acme", START) == record.num_bytes and store.bytes_used("globex", START) == 0
    assert store.delete("acme", "resp_1") is True
    assert store.get("acme", "resp_1", START) is None and store.delete("acme", "resp_1") is False
    assert store.bytes_used("acme", START) == 0


def test_expired_records_are_gone_on_read_and_by_the_sweep(store: ResponseStore) -> None:
    store.put("acme", _record("resp_old", created=START - 2 * DAY))
    store.put("acme", _record("resp_older", created=START - 3 * DAY))
    store.put("globex", _record("resp_other", created=START - 2 * DAY))
    store.put("acme", _record("resp_new"))
    # Expired rows no longer count, are not read, and a read deletes them.
    assert store.bytes_used("acme", START) == _record("resp_new").num_bytes
    assert store.get("acme", "resp_old", START) is None
    assert store.sweep(START, timeout_s=30) == 2  # resp_older and resp_other; resp_old went on its read
    assert store.sweep(START) == 0
    assert store.get("acme", "resp_new", START) is not None


def test_database_rows_go_with_their_tenant(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    store = DatabaseResponseStore(repo.db, ResponseStorageLimits(quota_bytes=10))
    store.put("acme", _record("resp_1"))
    with repo.db.transaction() as session:
        session.execute(delete(Tenant).where(Tenant.name == "acme"))
    with repo.db.transaction() as session:
        assert session.scalars(select(StoredResponseRow)).all() == []


def test_database_refuses_a_tenant_it_does_not_know(repo: TenancyRepo) -> None:
    store = DatabaseResponseStore(repo.db)
    with pytest.raises(TenantNotFoundError):
        store.put("nobody", _record("resp_1"))
    assert store.get("nobody", "resp_1", START) is None and store.bytes_used("nobody", START) == 0


def test_a_sweep_past_its_bound_stops_between_batches(
    repo: TenancyRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    store = DatabaseResponseStore(repo.db)
    for i in range(3):
        store.put("acme", _record(f"resp_{i}", created=START - 2 * DAY))
    monkeypatch.setattr(response_repo, "_SWEEP_BATCH", 1)
    assert store.sweep(START, timeout_s=1e-9) == 1  # one batch, then the bound is past
    assert store.sweep(START) == 2  # unbounded: the rest


def test_put_many_stores_each_record_for_its_tenant(store: ResponseStore) -> None:
    items = [("acme", _record("resp_1")), ("globex", _record("resp_2")), ("acme", _record("resp_3", "bye"))]
    assert store.put_many(items) == [None, None, None]
    for tenant, record in items:
        got = store.get(tenant, record.response_id, START)
        assert got is not None and got.body == record.body and got.input_items == record.input_items
        assert got.created_at == record.created_at and got.num_bytes == record.num_bytes
    assert store.get("globex", "resp_1", START) is None
    assert store.bytes_used("acme", START) == items[0][1].num_bytes + items[2][1].num_bytes
    assert store.put_many([]) == []


def test_database_put_many_fails_a_record_of_an_unknown_tenant_alone(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    store = DatabaseResponseStore(repo.db)
    outcomes = store.put_many([("acme", _record("resp_1")), ("nobody", _record("resp_2"))])
    assert outcomes[0] is None and isinstance(outcomes[1], TenantNotFoundError)
    assert store.get("acme", "resp_1", START) is not None


def test_database_put_many_is_one_transaction(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    store = DatabaseResponseStore(repo.db)
    store.put("acme", _record("resp_1"))
    with pytest.raises(IntegrityError):  # an id stored already: the batch fails as a whole
        store.put_many([("acme", _record("resp_2")), ("acme", _record("resp_1"))])
    assert store.get("acme", "resp_2", START) is None
