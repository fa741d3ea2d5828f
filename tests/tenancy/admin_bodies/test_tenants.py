"""tenancy/admin_bodies/tenants.py, keys.py, quota.py: strict parsing and round trips of the admin
API's tenant, key and quota bodies (ported from the tests of the hand-made codec they replaced,
assertions unchanged)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.engine.request import Priority
from weir.tenancy.admin_bodies.keys import KeyCreate
from weir.tenancy.admin_bodies.quota import quota_json
from weir.tenancy.admin_bodies.tenants import TenantCreate, TenantPatch
from weir.tenancy.context import QuotaLimits
from weir.tenancy.errors import FieldError
from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import QUOTA_FIELDS
from weir.tenancy.quota_limits import parse_quota_limits as parse_quota
from weir.tenancy.repository.records import KeySpec, TenantSpec, TenantUpdate
from weir.tenancy.store.enums import KeyScope, TenantStatus


# The codec's functions, as the models spell them.
def parse_tenant_spec(body: object) -> TenantSpec:
    return parse_model(TenantCreate, body).spec()


def parse_tenant_update(body: object) -> TenantUpdate:
    return parse_model(TenantPatch, body).update()


def parse_key_spec(body: object) -> KeySpec:
    return parse_model(KeyCreate, {} if body is None else body).spec()


def tenant_spec_json(spec: TenantSpec) -> Any:
    return TenantCreate.model_validate(spec).model_dump(mode="json", exclude_none=True)


def tenant_update_json(change: TenantUpdate) -> Any:
    return TenantPatch.model_validate(change).model_dump(mode="json", exclude_none=True)


def key_spec_json(spec: KeySpec) -> Any:
    return KeyCreate.model_validate(spec).model_dump(mode="json")


limit = st.one_of(st.none(), st.integers(1, 2**31 - 1))
quotas = st.builds(
    QuotaLimits,
    tokens_per_minute=st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    tokens_per_day=st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    max_concurrent=limit,
    max_prompt_tokens=limit,
    max_output_tokens=limit,
    models=st.lists(st.text(min_size=1, max_size=20), unique=True, max_size=4).map(tuple),
    ttft_slo_ms=limit,
    tpot_slo_ms=limit,
    default_max_tokens_reservation=limit,
    response_storage_bytes=st.one_of(st.none(), st.integers(0, 2**63 - 1)),  # 0: storing refused
    response_retention_s=st.one_of(st.none(), st.integers(1, 2**63 - 1)),
)


def test_quota_fields_are_exactly_the_issue_names() -> None:
    assert QUOTA_FIELDS == (
        "tokens_per_minute", "requests_per_minute", "tokens_per_day", "max_concurrent",
        "max_prompt_tokens", "max_output_tokens", "models", "ttft_slo_ms", "tpot_slo_ms", "default_max_tokens_reservation",
        "response_storage_bytes", "response_retention_s",
    )  # fmt: skip
    assert tuple(quota_json(QuotaLimits())) == QUOTA_FIELDS


@given(quotas)
def test_quota_round_trip(quota: QuotaLimits) -> None:
    assert parse_quota(quota_json(quota)) == quota


@given(
    st.builds(
        TenantSpec,
        name=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True),
        priority=st.sampled_from(list(Priority)),
        weight=st.floats(0.01, 1000),
        cache_scope=st.one_of(st.none(), st.from_regex(r"[a-z:]{1,10}", fullmatch=True)),
        quota=quotas,
    )
)
def test_tenant_spec_round_trip(spec: TenantSpec) -> None:
    assert parse_tenant_spec(tenant_spec_json(spec)) == spec


def test_tenants_json_file_shape_parses() -> None:
    # The shape of ../shared/workloads/tenants.json entries.
    spec = parse_tenant_spec(
        {"name": "quiet", "priority": "interactive", "weight": 1,
         "quota": {"tokens_per_minute": 20000, "max_concurrent": 8, "ttft_slo_ms": 2000}}
    )  # fmt: skip
    assert spec.priority is Priority.INTERACTIVE
    assert spec.quota == QuotaLimits(tokens_per_minute=20000, max_concurrent=8, ttft_slo_ms=2000)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "name"),
        ({"name": "acme", "colour": "red"}, "colour"),
        ({"name": "acme", "quota": {"tokens_per_minut": 5}}, "quota.tokens_per_minut"),
        ({"name": "acme", "quota": {"max_concurrent": "8"}}, "quota.max_concurrent"),
        ({"name": "acme", "quota": {"max_concurrent": 2.5}}, "quota.max_concurrent"),
        ({"name": "acme", "quota": {"models": "llama"}}, "quota.models"),
        ({"name": "acme", "quota": []}, "quota"),
        ({"name": "acme", "priority": "urgent"}, "priority"),
        ({"name": "acme", "weight": "heavy"}, "weight"),
        ({"name": "acme", "weight": True}, "weight"),
        ({"name": 7}, "name"),
    ],
)
def test_bad_tenant_bodies_name_the_field(body: object, field: str) -> None:
    with pytest.raises(FieldError) as info:
        parse_tenant_spec(body)
    assert info.value.field == field


def test_update_and_key_spec_parsing() -> None:
    change = TenantUpdate(priority=Priority.BATCH, status=TenantStatus.SUSPENDED)
    assert parse_tenant_update(tenant_update_json(change)) == change
    with pytest.raises(FieldError, match="status"):
        parse_tenant_update({"status": "paused"})
    with pytest.raises(FieldError, match="name"):
        parse_tenant_update({"name": "other"})  # renaming is not an update
    spec = parse_key_spec({"scopes": ["usage"], "expires_at": "2030-01-01T00:00:00Z"})
    assert spec.scopes == (KeyScope.USAGE,)
    assert spec.expires_at == dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert parse_key_spec(key_spec_json(spec)) == spec
    assert parse_key_spec(None).scopes == tuple(KeyScope)
    with pytest.raises(FieldError, match="expires_at"):
        parse_key_spec({"expires_at": "2030-01-01T00:00:00"})
    with pytest.raises(FieldError, match="scopes"):
        parse_key_spec({"scopes": ["admin"]})
