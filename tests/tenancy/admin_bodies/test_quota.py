"""tenancy/admin_bodies/quota.py: a key's own limits: the pydantic body, the repository (audited,
kept on rotation), the CLI."""

from __future__ import annotations

import json

import pytest

from weir.migrations.cli import main
from weir.tenancy.admin_bodies.quota import KeyLimitsBody, parse_key_limits
from weir.tenancy.context import QuotaLimits
from weir.tenancy.errors import FieldError
from weir.tenancy.repository.records import KeySpec, TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction


def test_the_body_parses_to_limits_and_refuses_what_a_key_cannot_set() -> None:
    limits = parse_key_limits({"requests_per_minute": 5, "models": ["a"], "tokens_per_day": None})
    assert limits == QuotaLimits(requests_per_minute=5, models=("a",))
    assert parse_key_limits(None) == QuotaLimits()
    for bad, field in (
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"tokens_per_minute": "5"}, "tokens_per_minute"),
        ({"max_concurrent": True}, "max_concurrent"),
        ({"ttft_slo_ms": 5}, "ttft_slo_ms"),
        ({"models": [""]}, "models"),
    ):
        with pytest.raises(FieldError) as info:
            parse_key_limits(bad)
        assert info.value.field.startswith(field)
    with pytest.raises(FieldError):
        parse_key_limits([1])
    assert set(KeyLimitsBody.model_json_schema()["properties"]) >= {"requests_per_minute", "models"}


def test_key_limits_are_audited_kept_on_rotation_and_models_stay_within_the_tenant(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec(name="acme", quota=QuotaLimits(models=("a", "b"))), actor="t")
    key_id = repo.issue_key("acme", KeySpec(), actor="t").view.id
    with pytest.raises(FieldError) as info:
        repo.set_key_limits(key_id, QuotaLimits(models=("c",)), actor="t")
    assert info.value.field == "limits.models"
    view = repo.set_key_limits(key_id, QuotaLimits(requests_per_minute=7, models=("a",)), actor="alice")
    assert view.limits == QuotaLimits(requests_per_minute=7, models=("a",))
    event = repo.list_audit(tenant="acme", limit=1)[0]
    assert (event.action, event.actor, event.target) == (AuditAction.KEY_LIMITS_SET, "alice", key_id)
    assert event.details["limits"]["requests_per_minute"] == 7  # type: ignore[index]
    assert event.details["previous"]["requests_per_minute"] is None  # type: ignore[index]
    record = repo.lookup_key(key_id)
    assert (
        record is not None
        and record.tenant.context(key_id, (), record.view.limits).key_quota.requests_per_minute == 7
    )
    rotated = repo.rotate_key(key_id, actor="t")
    assert rotated.view.limits == view.limits


def test_the_cli_sets_a_keys_limits(
    migrated: Database, repo: TenancyRepo, capsys: pytest.CaptureFixture[str]
) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="t")
    key_id = repo.issue_key("acme", KeySpec(), actor="t").view.id
    url = str(migrated.url)
    rc = main(
        [
            "admin",
            "keys",
            "limits",
            key_id,
            "--requests-per-minute",
            "3",
            "--model",
            "m",
            "--database-url",
            url,
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["limits"]["requests_per_minute"] == 3 and out["limits"]["models"] == ["m"]


def test_the_requests_user_field_is_saved_on_its_usage_record(repo: TenancyRepo, migrated: Database) -> None:
    from sqlalchemy import select

    from weir.tenancy.store.enums import UsageStatus
    from weir.tenancy.store.models import UsageRecord
    from weir.tenancy.usage.usage_codec import decode_record, encode_record
    from weir.tenancy.usage.usage_records import UsageRecordIn

    repo.create_tenant(TenantSpec(name="acme"), actor="t")
    hostile = '=HYPERLINK("http://x")' + "é" * 200
    record = UsageRecordIn("r1", "acme", None, "m", UsageStatus.COMPLETED, 3, 4, user=hostile)
    assert decode_record(encode_record(record)) == record  # the spool keeps it too
    repo.record_usage(record)
    with migrated.transaction() as session:
        assert session.scalars(select(UsageRecord.user)).one() == hostile
    with pytest.raises(FieldError):
        UsageRecordIn("r2", "acme", None, "m", UsageStatus.COMPLETED, 3, 4, user="x" * 257)
