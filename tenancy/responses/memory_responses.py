"""Stored responses in memory, for a server without a tenancy database (auth mode `none`, tests).

Same contract as the database store (`weir.tenancy.responses.response_records.ResponseStore`): per
tenant, counted, expiring. Lost when the process stops. A lock makes it safe from the worker
threads the gateway calls it on.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence

from weir.tenancy.responses.response_records import ResponseStorageLimits, StoredResponse


class MemoryResponseStore:
    """Stored responses per tenant, in dicts."""

    inline = True  # dict work under a lock held for microseconds: called on the event loop

    def __init__(self, limits: ResponseStorageLimits | None = None) -> None:
        self.limits = limits if limits is not None else ResponseStorageLimits()
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, StoredResponse]] = {}

    def put(self, tenant: str, record: StoredResponse) -> None:
        with self._lock:
            self._records.setdefault(tenant, {})[record.response_id] = record

    def put_many(self, items: Sequence[tuple[str, StoredResponse]]) -> list[Exception | None]:
        for tenant, record in items:
            self.put(tenant, record)
        return [None] * len(items)

    def _drop(self, tenant: str, response_id: str) -> bool:
        records = self._records.get(tenant)
        return records is not None and records.pop(response_id, None) is not None

    def get(self, tenant: str, response_id: str, now: dt.datetime) -> StoredResponse | None:
        with self._lock:
            record = self._records.get(tenant, {}).get(response_id)
            if record is not None and record.expires_at <= now:
                self._drop(tenant, response_id)
                return None
            return record

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            return self._drop(tenant, response_id)

    def bytes_used(self, tenant: str, now: dt.datetime) -> int:
        with self._lock:
            records = self._records.get(tenant, {})
            return sum(r.num_bytes for r in records.values() if r.expires_at > now)

    def sweep(self, now: dt.datetime, timeout_s: float | None = None) -> int:
        with self._lock:
            expired = [
                (tenant, response_id)
                for tenant, records in self._records.items()
                for response_id, record in records.items()
                if record.expires_at <= now
            ]
            for tenant, response_id in expired:
                self._drop(tenant, response_id)
            return len(expired)
