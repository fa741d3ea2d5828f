"""tenancy/parsing.py: a validation error names the field as the admin API always has
(`param` in the 422), and a body that is not an object is the 400 case (`body`)."""

from __future__ import annotations

import pytest

from weir.tenancy.admin_bodies.keys import KeyCreate
from weir.tenancy.admin_bodies.model_versions import TrafficBody
from weir.tenancy.admin_bodies.tenants import TenantCreate
from weir.tenancy.errors import FieldError
from weir.tenancy.parsing import parse_model
from weir.tenancy.quota_limits import parse_quota_limits


@pytest.mark.parametrize(
    ("model", "body", "where", "field", "words"),
    [
        (TenantCreate, [1, 2], "body", "body", "JSON object"),
        (TenantCreate, "acme", "body", "body", "JSON object"),
        (TenantCreate, {}, "body", "name", "is required"),
        (TenantCreate, {"name": "a", "colour": 1}, "body", "colour", "unknown field"),
        (TenantCreate, {"name": "a", "quota": {"max_concurrent": 0}}, "body", "quota.max_concurrent", "1"),
        (
            KeyCreate,
            {"scopes": ["inference", "root"]},
            "body",
            "scopes",
            "inference",
        ),  # the list, not scopes.1
        (TrafficBody, {"split": {"v1": "100"}}, "body", "split.v1", "integer"),  # a key is kept
        (TenantCreate, {"name": "a", "weight": 1}, "answer", None, None),
        (TenantCreate, {"name": 5}, "answer", "answer.name", "string"),
    ],
)
def test_the_error_names_the_field(
    model: type, body: object, where: str, field: str | None, words: str | None
) -> None:
    if field is None:
        assert parse_model(model, body, where)
        return
    with pytest.raises(FieldError) as info:
        parse_model(model, body, where)
    assert info.value.field == field
    assert words is not None and words in info.value.message


def test_a_value_error_reads_as_the_check_wrote_it() -> None:
    with pytest.raises(FieldError) as info:
        parse_quota_limits({"models": ["a", "a"]}, "quota")
    assert (info.value.field, info.value.message) == ("quota.models", "quota.models: must not repeat a model")
