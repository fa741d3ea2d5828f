"""weir.tenancy.store.audit: a trail's events carry its who and when, commit with the transaction,
and never hold a secret."""

from __future__ import annotations

import datetime as dt

import pytest

from weir.tenancy.store.audit import AuditTrail, list_events
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction

WHEN = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def test_a_trail_records_each_event_with_its_actor_and_time(migrated: Database) -> None:
    with migrated.transaction() as session:
        trail = AuditTrail(session, WHEN, "x" * 200)
        trail.record(AuditAction.TENANT_CREATE, tenant="acme", details={"weight": 2})
        trail.record(AuditAction.KEY_REVOKE, tenant="acme", target="key1")
    with migrated.transaction() as session:
        events = list_events(session)
    assert [(e.action, e.tenant, e.target, e.details) for e in events] == [
        (AuditAction.KEY_REVOKE, "acme", "key1", {}),
        (AuditAction.TENANT_CREATE, "acme", None, {"weight": 2}),
    ]
    assert {e.actor for e in events} == {"x" * 128}  # cut to the column's length
    assert {e.created_at for e in events} == {WHEN}


def test_an_event_naming_a_secret_is_refused_and_nothing_is_written(migrated: Database) -> None:
    with pytest.raises(ValueError, match="secrets"), migrated.transaction() as session:
        AuditTrail(session, WHEN, "admin").record(AuditAction.KEY_ISSUE, details={"secret_hash": "h"})
    with migrated.transaction() as session:
        assert list_events(session) == []
