"""A stored response, the storage limits, and the contract every response store keeps.

`POST /v1/responses` stores its answer unless `store: false`. What is kept is the response object
as answered (`body`) and the conversation items that made its prompt (`input_items`: the items
inherited through `previous_response_id` first, then the request's own), so the next turn
rebuilds the conversation from one record. A record belongs to one tenant: every read and delete
names the tenant, and another tenant's id is the same as an unknown one.

The tenant's storage quota counts `num_bytes` (the UTF-8 JSON of both parts) of its unexpired
records; a record expires `retention_s` after it was stored and is deleted on the first read
after that, or by the periodic sweep.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from weir.tenancy.quota_limits import QuotaLimits

# Defaults of the settings (`weir.gateway.settings.settings_server`): 64 MiB per tenant, kept 30 days.
DEFAULT_QUOTA_BYTES = 64 * 1024 * 1024
DEFAULT_RETENTION_S = 30 * 24 * 3600.0
DEFAULT_SWEEP_INTERVAL_S = 300.0
DEFAULT_STORE_TIMEOUT_S = 5.0  # a store call's bound on the request path, and one sweep's


@dataclass(frozen=True)
class ResponseStorageLimits:
    """Per tenant: the bytes its stored responses may hold together (0: storing refused), and
    how long one is kept."""

    quota_bytes: int = DEFAULT_QUOTA_BYTES
    retention_s: float = DEFAULT_RETENTION_S

    def __post_init__(self) -> None:
        if self.quota_bytes < 0:
            raise ValueError(f"quota_bytes must be >= 0, got {self.quota_bytes}")
        if not (math.isfinite(self.retention_s) and self.retention_s > 0):
            raise ValueError(f"retention_s must be > 0 and finite, got {self.retention_s}")


def tenant_storage_limits(default: ResponseStorageLimits, quota: QuotaLimits) -> ResponseStorageLimits:
    """A tenant's storage quota and retention: its own (`QuotaLimits.response_storage_bytes`,
    `.response_retention_s`) where an admin set them, else the server's `default`."""
    if quota.response_storage_bytes is None and quota.response_retention_s is None:
        return default
    return ResponseStorageLimits(
        default.quota_bytes if quota.response_storage_bytes is None else quota.response_storage_bytes,
        default.retention_s if quota.response_retention_s is None else float(quota.response_retention_s),
    )


def json_bytes(value: Any) -> int:
    """The size of `value` as compact UTF-8 JSON: what the quota counts."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class StoredResponse:
    """One stored answer and the conversation that led to it."""

    response_id: str
    body: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]
    created_at: dt.datetime
    expires_at: dt.datetime
    num_bytes: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.num_bytes < 0:
            object.__setattr__(self, "num_bytes", json_bytes(self.body) + json_bytes(list(self.input_items)))


class ResponseStore(Protocol):
    """Where stored responses live (the tenancy database, or memory for a server without one).

    Calls block (database I/O) unless `inline`: the gateway runs them in a worker thread, or on
    its event loop for a store whose calls are plain memory work. `now` is passed in so expiry is
    decided by one clock, the caller's.
    """

    limits: ResponseStorageLimits
    inline: bool

    def put(self, tenant: str, record: StoredResponse) -> None:
        """Store `record` for `tenant` (the caller checked the quota before generating it)."""

    def put_many(self, items: Sequence[tuple[str, StoredResponse]]) -> list[Exception | None]:
        """Store each (tenant, record) at once (one transaction for a database): per item, None
        when it was stored, else why not (its tenant does not exist: TenantNotFoundError), the
        others stored all the same. Raises when the whole call failed: then none was stored."""

    def get(self, tenant: str, response_id: str, now: dt.datetime) -> StoredResponse | None:
        """The tenant's record, or None (unknown, another tenant's, or expired: then deleted)."""

    def delete(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's record; False when it has none of that id."""

    def bytes_used(self, tenant: str, now: dt.datetime) -> int:
        """The bytes the tenant's unexpired records hold."""

    def sweep(self, now: dt.datetime, timeout_s: float | None = None) -> int:
        """Delete the expired records; how many were deleted. `timeout_s` bounds the work: past
        it the sweep stops between batches (the rest is left to the next one)."""
