"""The repository on SQLite and PostgreSQL: tenants, quotas, keys, usage, audit, storage safety."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import String, Text, select
from sqlalchemy.types import JSON

from tests.tenancy.clock import START, FakeClock
from weir.engine.request import FinishReason, Priority
from weir.tenancy.context import QuotaLimits
from weir.tenancy.errors import (
    CacheScopeConflictError,
    FieldError,
    KeyInactiveError,
    KeyNotFoundError,
    TenantExistsError,
    TenantNotFoundError,
)
from weir.tenancy.repository.records import KeySpec, TenantSpec, TenantUpdate
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import AuditAction, KeyScope, KeyState, TenantStatus, UsageStatus
from weir.tenancy.store.models import Base
from weir.tenancy.usage.usage_records import UsageRecordIn

ACTOR = "test"
QUOTA = QuotaLimits(
    tokens_per_minute=2_000_000,
    tokens_per_day=50_000_000_000,  # beyond 32 bits
    max_concurrent=64,
    max_prompt_tokens=4096,
    max_output_tokens=1024,
    models=("smollm2", "llama"),
    ttft_slo_ms=2000,
    tpot_slo_ms=50,
    default_max_tokens_reservation=256,
    response_storage_bytes=10_000_000_000,  # beyond 32 bits
    response_retention_s=3600,
)


def _tenant(repo: TenancyRepo, name: str = "acme", **kwargs: object) -> None:
    repo.create_tenant(TenantSpec(name, **kwargs), actor=ACTOR)  # type: ignore[arg-type]


# -- tenants ---------------------------------------------------------------------------------------


def test_tenant_names_and_a_search_page(repo: TenancyRepo) -> None:
    for name in ("acme", "acme-eu", "globex", "a_c", "abc"):
        repo.create_tenant(TenantSpec(name), actor="test")
    assert repo.tenant_names() == ["a_c", "abc", "acme", "acme-eu", "globex"]
    page, total = repo.search_tenants("ACME", limit=1)
    assert [t.name for t in page] == ["acme"] and total == 2
    page, total = repo.search_tenants("acme", limit=1, offset=1)
    assert [t.name for t in page] == ["acme-eu"] and total == 2
    # `_` and `%` are text, not LIKE wildcards.
    assert [t.name for t in repo.search_tenants("_", limit=10)[0]] == ["a_c"]
    assert repo.search_tenants("%", limit=10) == ([], 0)
    assert repo.search_tenants("", limit=10)[1] == 5
    with pytest.raises(FieldError):
        repo.search_tenants("", limit=0)


def test_create_get_list_tenants(repo: TenancyRepo) -> None:
    created = repo.create_tenant(
        TenantSpec("acme", Priority.INTERACTIVE, weight=2.5, quota=QUOTA), actor=ACTOR
    )
    assert created.quota == QUOTA
    assert created.status is TenantStatus.ACTIVE
    assert created.cache_scope == "acme"  # the tenant's own scope by default
    assert created.created_at == START
    _tenant(repo, "globex", priority=Priority.BATCH, cache_scope="shared:docs")
    got = repo.get_tenant("acme")
    assert got == created
    assert got.priority is Priority.INTERACTIVE and got.weight == 2.5
    assert [t.name for t in repo.list_tenants()] == ["acme", "globex"]
    assert repo.get_tenant("globex").cache_scope == "shared:docs"


def test_duplicate_and_missing_tenants(repo: TenancyRepo) -> None:
    _tenant(repo)
    with pytest.raises(TenantExistsError):
        _tenant(repo)
    with pytest.raises(TenantNotFoundError):
        repo.get_tenant("nobody")
    with pytest.raises(TenantNotFoundError):
        repo.set_quota("nobody", QUOTA, actor=ACTOR)
    assert len(repo.list_tenants()) == 1


def test_update_suspend_and_quota(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo)
    clock.advance(minutes=1)
    updated = repo.update_tenant("acme", TenantUpdate(priority=Priority.BATCH, weight=3.0), actor=ACTOR)
    assert (updated.priority, updated.weight, updated.updated_at) == (Priority.BATCH, 3.0, clock.now)
    assert repo.suspend_tenant("acme", actor=ACTOR).status is TenantStatus.SUSPENDED
    back = repo.update_tenant("acme", TenantUpdate(status=TenantStatus.ACTIVE), actor=ACTOR)
    assert back.status is TenantStatus.ACTIVE
    assert repo.set_quota("acme", QUOTA, actor=ACTOR).quota == QUOTA
    assert repo.set_quota("acme", QuotaLimits(max_concurrent=1), actor=ACTOR).quota == QuotaLimits(
        max_concurrent=1
    )
    with pytest.raises(FieldError, match="quota.max_concurrent"):
        repo.set_quota("acme", QuotaLimits(max_concurrent=0), actor=ACTOR)


# -- keys ------------------------------------------------------------------------------------------


def test_issue_lookup_list_keys(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo, quota=QUOTA)
    issued = repo.issue_key("acme", KeySpec(scopes=(KeyScope.INFERENCE,)), actor=ACTOR)
    record = repo.lookup_key(issued.view.id)
    assert record is not None
    assert repo.hasher.verify(issued.key, record.secret_hash)
    assert record.tenant.quota == QUOTA
    assert record.view.scopes == (KeyScope.INFERENCE,)
    assert record.view.state(clock.now) is KeyState.ACTIVE
    assert issued.key not in repr(issued) and issued.key not in repr(record)
    assert repo.lookup_key("a" * 16) is None
    second = repo.issue_key("acme", KeySpec(), actor=ACTOR)
    assert {k.id for k in repo.list_keys("acme")} == {issued.view.id, second.view.id}
    repo.touch_key(issued.view.id, clock.now)
    assert repo.get_key(issued.view.id).last_used_at == clock.now


def test_revoke_is_idempotent_and_rotate_replaces(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo)
    first = repo.issue_key("acme", KeySpec(), actor=ACTOR)
    clock.advance(seconds=5)
    rotated = repo.rotate_key(first.view.id, actor=ACTOR)
    assert rotated.view.id != first.view.id and rotated.key != first.key
    assert repo.get_key(first.view.id).state(clock.now) is KeyState.REVOKED
    assert repo.get_key(rotated.view.id).state(clock.now) is KeyState.ACTIVE
    with pytest.raises(KeyInactiveError):
        repo.rotate_key(first.view.id, actor=ACTOR)
    revoked = repo.revoke_key(rotated.view.id, actor=ACTOR)
    clock.advance(seconds=5)
    assert repo.revoke_key(rotated.view.id, actor=ACTOR).revoked_at == revoked.revoked_at
    with pytest.raises(KeyNotFoundError):
        repo.revoke_key("b" * 16, actor=ACTOR)


def test_expiry(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo)
    with pytest.raises(FieldError, match="expires_at"):
        repo.issue_key("acme", KeySpec(expires_at=clock.now), actor=ACTOR)
    issued = repo.issue_key("acme", KeySpec(expires_at=clock.now + dt.timedelta(hours=1)), actor=ACTOR)
    record = repo.lookup_key(issued.view.id)
    assert record is not None and record.view.expires_at == clock.now + dt.timedelta(hours=1)
    clock.advance(hours=1)
    assert record.view.state(clock.now) is KeyState.EXPIRED
    with pytest.raises(KeyInactiveError):
        repo.rotate_key(issued.view.id, actor=ACTOR)


def test_no_plaintext_secret_anywhere_in_the_database(repo: TenancyRepo) -> None:
    """Scan every text-like column of every table after issuing, rotating and bootstrapping."""
    _tenant(repo, quota=QUOTA)
    secrets = [repo.issue_key("acme", KeySpec(), actor=ACTOR).key for _ in range(3)]
    first_id = secrets[0].split("-")[2]
    secrets.append(repo.rotate_key(first_id, actor=ACTOR).key)
    admin_token = "weir-admin-" + "q" * 52
    assert repo.store_admin_token(admin_token, actor=ACTOR, replace=False)
    needles = [s.split("-")[-1] for s in secrets] + [admin_token, admin_token.removeprefix("weir-admin-")]
    scanned = 0
    with repo.db.transaction() as session:
        for table in Base.metadata.sorted_tables:
            columns = [c for c in table.columns if isinstance(c.type, String | Text | JSON)]
            if not columns:  # e.g. budget_buckets holds only numbers
                continue
            for row in session.execute(select(*columns)):
                for value in row:
                    text = str(value)
                    scanned += 1
                    for needle in needles:
                        assert needle not in text, f"secret found in {table.name}"
    assert scanned > 20  # the scan saw the key, tenant and audit rows


# -- usage -----------------------------------------------------------------------------------------


def _usage(
    key_id: str | None, status: UsageStatus, prompt: int, completion: int, **kw: object
) -> UsageRecordIn:
    return UsageRecordIn(
        request_id=f"req-{status.value}-{prompt}-{completion}",
        tenant_id="acme",
        key_id=key_id,
        model="smollm2@v1",
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        **kw,  # type: ignore[arg-type]
    )


def test_usage_records_for_completed_failed_and_cancelled(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo)
    _tenant(repo, "globex")
    key_id = repo.issue_key("acme", KeySpec(), actor=ACTOR).view.id
    repo.record_usage(
        _usage(
            key_id,
            UsageStatus.COMPLETED,
            100,
            20,
            cached_tokens=64,
            ttft_ms=12.5,
            e2e_ms=300.0,
            finish_reason=FinishReason.STOP,
        )  # fmt: skip
    )
    repo.record_usage(
        _usage(key_id, UsageStatus.FAILED, 50, 3, ttft_ms=10.0, finish_reason=FinishReason.ERROR)
    )
    repo.record_usage(_usage(key_id, UsageStatus.CANCELLED, 70, 5, finish_reason=FinishReason.ABORT))
    repo.record_usage(_usage(None, UsageStatus.FAILED, 9, 0))  # failed before any token, no key
    [day] = repo.usage_by_day("acme")
    assert day.day == START.date()
    assert (day.num_requests, day.num_completed, day.num_failed, day.num_cancelled) == (4, 1, 2, 1)
    assert (day.prompt_tokens, day.completion_tokens, day.cached_tokens) == (229, 28, 64)
    assert day.total_tokens == 257
    assert repo.usage_by_day("globex") == []

    from weir.tenancy.store.models import UsageRecord  # the stored rows keep every field

    with repo.db.transaction() as session:
        rows = {r.status: r for r in session.scalars(select(UsageRecord).where(UsageRecord.key_id == key_id))}
    assert rows[UsageStatus.COMPLETED].ttft_ms == 12.5 and rows[UsageStatus.COMPLETED].e2e_ms == 300.0
    assert rows[UsageStatus.CANCELLED].finish_reason is FinishReason.ABORT
    assert rows[UsageStatus.FAILED].model == "smollm2@v1"
    assert rows[UsageStatus.COMPLETED].created_at == clock.now


def test_usage_per_day_and_range(repo: TenancyRepo, clock: FakeClock) -> None:
    _tenant(repo)
    for day_offset, tokens in ((0, 10), (0, 5), (1, 7), (3, 1)):
        when = START + dt.timedelta(days=day_offset)
        repo.record_usage(_usage(None, UsageStatus.COMPLETED, tokens, 1, created_at=when))
    days = repo.usage_by_day("acme")
    assert [(d.day, d.prompt_tokens, d.num_requests) for d in days] == [
        (START.date(), 15, 2),
        (START.date() + dt.timedelta(days=1), 7, 1),
        (START.date() + dt.timedelta(days=3), 1, 1),
    ]
    middle = repo.usage_by_day(
        "acme", since=START.date() + dt.timedelta(days=1), until=START.date() + dt.timedelta(days=2)
    )
    assert [d.prompt_tokens for d in middle] == [7]
    with pytest.raises(FieldError, match="since"):
        repo.usage_by_day("acme", since=START.date(), until=START.date() - dt.timedelta(days=1))


def test_usage_day_is_the_utc_day() -> None:
    # 23:30 at UTC-5 is 04:30 the next day in UTC.
    late = dt.datetime(2030, 1, 1, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    assert late.astimezone(dt.UTC).date() == dt.date(2030, 1, 2)


def test_usage_for_unknown_tenant_or_key_is_refused(repo: TenancyRepo) -> None:
    _tenant(repo)
    with pytest.raises(TenantNotFoundError):
        repo.record_usage(
            UsageRecordIn(
                "r", "nobody", None, "m", UsageStatus.COMPLETED, prompt_tokens=1, completion_tokens=1
            )
        )
    with pytest.raises(KeyNotFoundError):
        repo.record_usage(_usage("c" * 16, UsageStatus.COMPLETED, 1, 1))
    assert repo.usage_by_day("acme") == []  # nothing half-written


usage_records = st.lists(
    st.tuples(
        st.sampled_from(list(UsageStatus)),
        st.integers(0, 10_000),
        st.integers(0, 10_000),
        st.integers(0, 2),  # day offset
    ),
    max_size=12,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=usage_records, tenant_no=st.integers(0, 10**9))
def test_usage_sums_match_what_was_recorded(repo: TenancyRepo, records: list, tenant_no: int) -> None:
    name = f"t{tenant_no}"
    if name in {t.name for t in repo.list_tenants()}:
        return
    _tenant(repo, name)
    batch = [
        UsageRecordIn(
            f"r{i}",
            name,
            None,
            "m",
            status,
            prompt_tokens=p,
            completion_tokens=c,
            cached_tokens=p // 2,
            created_at=START + dt.timedelta(days=d),
        )  # fmt: skip
        for i, (status, p, c, d) in enumerate(records)
    ]
    repo.record_usages(batch)
    days = repo.usage_by_day(name)
    assert sum(d.num_requests for d in days) == len(records)
    assert sum(d.prompt_tokens for d in days) == sum(r[1] for r in records)
    assert sum(d.completion_tokens for d in days) == sum(r[2] for r in records)
    assert sum(d.cached_tokens for d in days) == sum(r[1] // 2 for r in records)
    for status, attr in ((UsageStatus.COMPLETED, "num_completed"), (UsageStatus.FAILED, "num_failed")):
        assert sum(getattr(d, attr) for d in days) == sum(1 for r in records if r[0] is status)
    assert len(days) == len({r[3] for r in records})


# -- audit -----------------------------------------------------------------------------------------


def test_every_admin_action_is_audited(repo: TenancyRepo) -> None:
    _tenant(repo, quota=QUOTA)
    repo.update_tenant("acme", TenantUpdate(weight=2.0), actor="alice")
    repo.suspend_tenant("acme", actor=ACTOR)
    repo.set_quota("acme", QUOTA, actor=ACTOR)
    key = repo.issue_key("acme", KeySpec(), actor=ACTOR)
    new = repo.rotate_key(key.view.id, actor=ACTOR)
    repo.revoke_key(new.view.id, actor=ACTOR)
    repo.revoke_key(new.view.id, actor=ACTOR)  # no change: no event
    repo.update_tenant("acme", TenantUpdate(weight=2.0), actor=ACTOR)  # no change: no event
    repo.store_admin_token("weir-admin-x", actor="bootstrap", replace=False)
    events = repo.list_audit()
    assert [e.action for e in reversed(events)] == [
        AuditAction.TENANT_CREATE,
        AuditAction.TENANT_UPDATE,
        AuditAction.TENANT_SUSPEND,
        AuditAction.QUOTA_SET,
        AuditAction.KEY_ISSUE,
        AuditAction.KEY_ROTATE,
        AuditAction.KEY_REVOKE,
        AuditAction.ADMIN_TOKEN_SET,
    ]
    assert events[-2].actor == "alice" and events[-2].details == {"weight": 2.0}
    rotate = next(e for e in events if e.action is AuditAction.KEY_ROTATE)
    assert rotate.target == key.view.id and rotate.details == {"replaced_by": new.view.id}
    assert len(repo.list_audit(tenant="acme")) == 7
    newest_two = repo.list_audit(limit=2)
    assert len(newest_two) == 2
    assert repo.list_audit(before_id=newest_two[-1].id, limit=1)[0].id < newest_two[-1].id
    with pytest.raises(FieldError, match="limit"):
        repo.list_audit(limit=0)


def test_failed_action_leaves_no_audit_event(repo: TenancyRepo) -> None:
    _tenant(repo)
    with pytest.raises(TenantExistsError):
        _tenant(repo)
    assert len(repo.list_audit()) == 1


# -- admin token -----------------------------------------------------------------------------------


def test_admin_token_stored_once_unless_replaced(repo: TenancyRepo) -> None:
    assert repo.admin_token_hash() is None
    assert repo.store_admin_token("weir-admin-a", actor=ACTOR, replace=False)
    assert not repo.store_admin_token("weir-admin-b", actor=ACTOR, replace=False)
    assert repo.admin_token_hash() == repo.hasher.hash("weir-admin-a")
    assert repo.store_admin_token("weir-admin-b", actor=ACTOR, replace=True)
    assert repo.admin_token_hash() == repo.hasher.hash("weir-admin-b")


# -- cache scopes (issue 10, defect 9) --------------------------------------------------------------


def test_cache_scopes_are_shared_only_on_purpose(repo: TenancyRepo) -> None:
    _tenant(repo, "tb")
    _tenant(repo, "tc", cache_scope="team")
    refused = [
        (TenantSpec("ok2", cache_scope="tb"), "cache_scope"),  # another tenant's (default) scope
        (TenantSpec("td", cache_scope="team"), "cache_scope"),  # another tenant's custom scope
        (TenantSpec("team"), "name"),  # named after a scope, whose default scope it would join
        (TenantSpec("te", cache_scope="tc"), "cache_scope"),  # another tenant's name
    ]
    for spec, field in refused:
        with pytest.raises(CacheScopeConflictError) as info:
            repo.create_tenant(spec, actor=ACTOR)
        assert info.value.field == field
    with pytest.raises(CacheScopeConflictError):
        repo.update_tenant("tb", TenantUpdate(cache_scope="team"), actor=ACTOR)
    assert {t.name: t.cache_scope for t in repo.list_tenants()} == {"tb": "tb", "tc": "team"}

    shared = repo.create_tenant(TenantSpec("ok2", share_cache_scope_with="tb"), actor=ACTOR)
    assert shared.cache_scope == "tb"
    team = repo.create_tenant(TenantSpec("team", share_cache_scope_with="tc"), actor=ACTOR)
    assert team.cache_scope == "team"
    assert (
        repo.update_tenant("tb", TenantUpdate(share_cache_scope_with="tc"), actor=ACTOR).cache_scope == "team"
    )
    events = {e.tenant: e for e in repo.list_audit() if e.action is AuditAction.TENANT_CREATE}
    assert events["ok2"].details["share_cache_scope_with"] == "tb"
    update = repo.list_audit(tenant="tb", limit=1)[0]
    assert update.action is AuditAction.TENANT_UPDATE
    assert update.details == {"cache_scope": "team", "share_cache_scope_with": "tc"}
    with pytest.raises(FieldError) as missing:
        repo.create_tenant(TenantSpec("tf", share_cache_scope_with="nobody"), actor=ACTOR)
    assert missing.value.field == "share_cache_scope_with"


def test_lookups_take_a_timeout(repo: TenancyRepo) -> None:
    """The auth path bounds its queries (SQLite busy timeout, PostgreSQL statement timeout)."""
    _tenant(repo)
    issued = repo.issue_key("acme", KeySpec(), actor=ACTOR)
    record = repo.lookup_key(issued.view.id, timeout_s=0.5)
    assert record is not None and record.tenant.name == "acme"
    repo.touch_key(issued.view.id, START, timeout_s=0.5)
    assert repo.get_key(issued.view.id).last_used_at == START
