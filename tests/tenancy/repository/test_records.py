"""Validation of the typed inputs."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from weir.engine.request import Priority
from weir.tenancy.context import QuotaLimits
from weir.tenancy.errors import FieldError
from weir.tenancy.repository.records import KeySpec, TenantSpec, TenantUpdate, validate_quota
from weir.tenancy.store.enums import KeyScope


@pytest.mark.parametrize("name", ["", "Acme", "-x", "a b", "a/b", "x" * 65, "é"])
def test_bad_tenant_names(name: str) -> None:
    with pytest.raises(FieldError) as info:
        TenantSpec(name)
    assert info.value.field == "name"


@pytest.mark.parametrize("weight", [0, -1, math.inf, math.nan, 1e7])
def test_bad_weights(weight: float) -> None:
    with pytest.raises(FieldError, match="weight"):
        TenantSpec("acme", weight=weight)


def test_good_spec_defaults() -> None:
    spec = TenantSpec("acme-1.eu_west")
    assert spec.priority is Priority.STANDARD and spec.weight == 1.0 and spec.cache_scope is None


@pytest.mark.parametrize(
    ("quota", "field"),
    [
        (QuotaLimits(tokens_per_minute=0), "quota.tokens_per_minute"),
        (QuotaLimits(max_concurrent=-3), "quota.max_concurrent"),
        (QuotaLimits(max_prompt_tokens=2**31), "quota.max_prompt_tokens"),
        (QuotaLimits(ttft_slo_ms=True), "quota.ttft_slo_ms"),  # type: ignore[arg-type]
        (QuotaLimits(models=("a", "a")), "quota.models"),
        (QuotaLimits(models=("",)), "quota.models"),
    ],
)
def test_bad_quotas_name_the_field(quota: QuotaLimits, field: str) -> None:
    with pytest.raises(FieldError) as info:
        validate_quota(quota)
    assert info.value.field == field


def test_update_needs_a_field() -> None:
    with pytest.raises(FieldError):
        TenantUpdate()
    assert TenantUpdate(weight=2).weight == 2


def test_key_spec_validation() -> None:
    assert KeySpec().scopes == tuple(KeyScope)
    with pytest.raises(FieldError, match="scopes"):
        KeySpec(scopes=())
    with pytest.raises(FieldError, match="scopes"):
        KeySpec(scopes=(KeyScope.USAGE, KeyScope.USAGE))
    with pytest.raises(FieldError, match="expires_at"):
        KeySpec(expires_at=dt.datetime(2030, 1, 1))
