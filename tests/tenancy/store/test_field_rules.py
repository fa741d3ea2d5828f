"""The ground floor's field rules: a tenant's name and an aware time."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.tenancy.errors import FieldError
from weir.tenancy.store.field_rules import TENANT_NAME_RE, check_aware, validate_tenant_name


@pytest.mark.parametrize("name", ["", "Acme", "-x", "a b", "a/b", "x" * 65, "é", None, 7])
def test_a_bad_tenant_name_is_refused_naming_the_field(name: object) -> None:
    with pytest.raises(FieldError) as info:
        validate_tenant_name(name, "tenant_id")
    assert info.value.field == "tenant_id"


@given(st.from_regex(TENANT_NAME_RE, fullmatch=True))
def test_every_name_the_rule_matches_is_accepted_as_is(name: str) -> None:
    assert validate_tenant_name(name) == name


def test_a_naive_time_is_refused_and_an_aware_one_or_none_passes() -> None:
    with pytest.raises(FieldError) as info:
        check_aware(dt.datetime(2030, 1, 1), "expires_at")
    assert info.value.field == "expires_at"
    check_aware(dt.datetime(2030, 1, 1, tzinfo=dt.UTC), "expires_at")
    check_aware(None, "expires_at")
