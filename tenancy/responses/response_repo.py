"""Stored responses in the tenancy database (`stored_responses`, migration 0011).

Every query names the tenant by its name through a join on `tenants` (`put_many` looks its
batch's tenants up once, in the transaction that inserts it), so one tenant's ids never reach
another's rows. The rows cascade with their tenant. A read of an expired row deletes it in
the same transaction; `sweep` deletes the rest in bounded batches.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence

from sqlalchemy import JSON, BigInteger, ScalarSelect, String, delete, func, insert, literal, select

from weir.tenancy.errors import TenantNotFoundError
from weir.tenancy.responses.response_records import ResponseStorageLimits, StoredResponse
from weir.tenancy.store.db import Database
from weir.tenancy.store.models import StoredResponse as StoredResponseRow
from weir.tenancy.store.models import Tenant, UTCDateTime

# A statement on the request path waits at most this long for a lock (then 503, not a stall).
REQUEST_TIMEOUT_S = 5.0
_SWEEP_BATCH = 500
_MIN_BATCH_TIMEOUT_S = 0.1  # a batch started just before the sweep's bound still gets this


def _tenant_id(name: str) -> ScalarSelect[int]:
    return select(Tenant.id).where(Tenant.name == name).scalar_subquery()


class DatabaseResponseStore:
    """`weir.tenancy.responses.response_records.ResponseStore` over one `Database`."""

    inline = False  # database I/O: called on a worker thread

    def __init__(self, db: Database, limits: ResponseStorageLimits | None = None) -> None:
        self.db = db
        self.limits = limits if limits is not None else ResponseStorageLimits()

    def put(self, tenant: str, record: StoredResponse) -> None:
        # One statement: the tenant's id is looked up inside the insert (ids are fresh, never replaced).
        columns = StoredResponseRow.__table__.c
        values = select(
            literal(record.response_id, String),
            Tenant.id,
            literal(record.created_at, UTCDateTime()),
            literal(record.expires_at, UTCDateTime()),
            literal(record.num_bytes, BigInteger),
            literal(record.body, JSON),
            literal(list(record.input_items), JSON),
        ).where(Tenant.name == tenant)
        names = ("id", "tenant_id", "created_at", "expires_at", "num_bytes", "body", "input_items")
        with self.db.transaction(timeout_s=REQUEST_TIMEOUT_S) as session:
            statement = insert(StoredResponseRow).from_select([columns[n] for n in names], values)
            if session.execute(statement.returning(columns["id"])).first() is None:
                raise TenantNotFoundError(tenant)

    def put_many(self, items: Sequence[tuple[str, StoredResponse]]) -> list[Exception | None]:
        # One transaction: the tenants' ids in one query, then one executemany insert.
        if not items:
            return []
        outcomes: list[Exception | None] = []
        rows = []
        with self.db.transaction(timeout_s=REQUEST_TIMEOUT_S) as session:
            names = {tenant for tenant, _ in items}
            found = session.execute(select(Tenant.name, Tenant.id).where(Tenant.name.in_(names)))
            ids = {name: tenant_id for name, tenant_id in found}
            for tenant, record in items:
                tenant_id = ids.get(tenant)
                if tenant_id is None:
                    outcomes.append(TenantNotFoundError(tenant))
                    continue
                outcomes.append(None)
                rows.append(
                    {
                        "id": record.response_id,
                        "tenant_id": tenant_id,
                        "created_at": record.created_at,
                        "expires_at": record.expires_at,
                        "num_bytes": record.num_bytes,
                        "body": record.body,
                        "input_items": list(record.input_items),
                    }
                )
            if rows:
                session.execute(insert(StoredResponseRow), rows)
        return outcomes

    def get(self, tenant: str, response_id: str, now: dt.datetime) -> StoredResponse | None:
        with self.db.transaction(timeout_s=REQUEST_TIMEOUT_S) as session:
            row = session.scalars(
                select(StoredResponseRow).where(
                    StoredResponseRow.id == response_id, StoredResponseRow.tenant_id == _tenant_id(tenant)
                )
            ).one_or_none()
            if row is None:
                return None
            if row.expires_at <= now:
                session.delete(row)
                return None
            return StoredResponse(
                response_id=row.id,
                body=row.body,
                input_items=tuple(row.input_items),
                created_at=row.created_at,
                expires_at=row.expires_at,
                num_bytes=row.num_bytes,
            )

    def delete(self, tenant: str, response_id: str) -> bool:
        with self.db.transaction(timeout_s=REQUEST_TIMEOUT_S) as session:
            result = session.execute(
                delete(StoredResponseRow).where(
                    StoredResponseRow.id == response_id, StoredResponseRow.tenant_id == _tenant_id(tenant)
                )
            )
            return bool(getattr(result, "rowcount", 0))

    def bytes_used(self, tenant: str, now: dt.datetime) -> int:
        with self.db.transaction(timeout_s=REQUEST_TIMEOUT_S) as session:
            total = session.scalar(
                select(func.coalesce(func.sum(StoredResponseRow.num_bytes), 0)).where(
                    StoredResponseRow.tenant_id == _tenant_id(tenant), StoredResponseRow.expires_at > now
                )
            )
            return int(total or 0)

    def sweep(self, now: dt.datetime, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        deleted = 0
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), _MIN_BATCH_TIMEOUT_S)
            with self.db.transaction(timeout_s=left) as session:
                ids = session.scalars(
                    select(StoredResponseRow.id)
                    .where(StoredResponseRow.expires_at <= now)
                    .limit(_SWEEP_BATCH)
                ).all()
                if ids:
                    session.execute(delete(StoredResponseRow).where(StoredResponseRow.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < _SWEEP_BATCH or (deadline is not None and time.monotonic() >= deadline):
                return deleted
