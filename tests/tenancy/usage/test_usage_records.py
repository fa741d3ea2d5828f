"""Validation of the usage record (`weir.tenancy.usage.usage_records`): every field named when wrong."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from weir.tenancy.errors import FieldError
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn


def _usage(**kw: object) -> UsageRecordIn:
    base: dict[str, object] = dict(
        request_id="r", tenant_id="acme", key_id=None, model="m", status=UsageStatus.COMPLETED,
        prompt_tokens=10, completion_tokens=2,
    )  # fmt: skip
    base.update(kw)
    return UsageRecordIn(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"cached_tokens": 11}, "cached_tokens"),
        ({"completion_tokens": 1.5}, "completion_tokens"),
        ({"ttft_ms": -1.0}, "ttft_ms"),
        ({"e2e_ms": math.nan}, "e2e_ms"),
        ({"request_id": ""}, "request_id"),
        ({"tenant_id": "Nope"}, "tenant_id"),
        ({"status": "completed"}, "status"),
        ({"created_at": dt.datetime(2030, 1, 1)}, "created_at"),
    ],
)
def test_bad_usage_records(change: dict[str, object], field: str) -> None:
    with pytest.raises(FieldError) as info:
        _usage(**change)
    assert info.value.field == field


def test_zero_token_usage_is_valid() -> None:
    assert _usage(prompt_tokens=0, completion_tokens=0).prompt_tokens == 0
