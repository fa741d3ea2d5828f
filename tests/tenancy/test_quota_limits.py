"""tenancy/quota_limits.py: the quota fields are declared once, and everything that lists them
(the admin bodies, the row mapping, the CLI flags, the key's subset) derives from that."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from weir.tenancy.admin_bodies.quota import KeyLimitsBody
from weir.tenancy.cli.cli import add_key_limit_options, add_quota_options
from weir.tenancy.quota_limits import (
    INT_QUOTA_FIELDS,
    KEY_LIMIT_FIELDS,
    MAX_INT32,
    MAX_INT64,
    QUOTA_FIELDS,
    QuotaLimits,
    quota_from,
    quota_values,
)
from weir.tenancy.store.models import KeyLimit, Quota

limit32 = st.one_of(st.none(), st.integers(1, MAX_INT32))
limit64 = st.one_of(st.none(), st.integers(1, MAX_INT64))
quotas = st.builds(
    QuotaLimits,
    tokens_per_minute=limit64,
    requests_per_minute=limit64,
    tokens_per_day=limit64,
    max_concurrent=limit32,
    max_prompt_tokens=limit32,
    max_output_tokens=limit32,
    models=st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=3).map(tuple),
    ttft_slo_ms=limit32,
    tpot_slo_ms=limit32,
    default_max_tokens_reservation=limit32,
    response_storage_bytes=st.none() | st.integers(0, 2**63 - 1),
    response_retention_s=limit64,
)


def test_the_field_lists_are_derived_from_the_declaration() -> None:
    assert INT_QUOTA_FIELDS == tuple(n for n in QUOTA_FIELDS if n != "models")
    assert set(KEY_LIMIT_FIELDS) == set(QUOTA_FIELDS) - {
        "ttft_slo_ms",
        "tpot_slo_ms",
        "default_max_tokens_reservation",
        "response_storage_bytes",  # the tenant's stored responses: not a key's
        "response_retention_s",
    }
    assert tuple(KeyLimitsBody.model_fields) == KEY_LIMIT_FIELDS
    # The database has a column for each field it maps (a limit added without one fails here).
    assert set(QUOTA_FIELDS) <= set(Quota.__table__.columns.keys())
    assert set(KEY_LIMIT_FIELDS) <= set(KeyLimit.__table__.columns.keys())


def test_the_cli_has_a_flag_for_every_field() -> None:
    for add, names in ((add_quota_options, QUOTA_FIELDS), (add_key_limit_options, KEY_LIMIT_FIELDS)):
        parser = argparse.ArgumentParser()
        add(parser)
        assert {a.dest for a in parser._actions if a.dest != "help"} == set(names)


@given(quotas)
def test_values_and_back_round_trip_through_a_row_and_the_schema(quota: QuotaLimits) -> None:
    row = SimpleNamespace(**quota_values(quota, QUOTA_FIELDS))  # what the row mapping writes
    assert isinstance(row.models, list)
    assert quota_from(row, QUOTA_FIELDS) == quota
    assert TypeAdapter(QuotaLimits).validate_python(quota.as_dict()) == quota
