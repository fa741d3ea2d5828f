"""The stored response's size (what the quota counts) and the storage limits' checks."""

from __future__ import annotations

import datetime as dt

import pytest

from weir.tenancy.responses.response_records import ResponseStorageLimits, StoredResponse, json_bytes

WHEN = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_bytes_are_the_utf8_json_of_both_parts() -> None:
    record = StoredResponse("resp_1", {"text": "héllo"}, ({"a": 1},), WHEN, WHEN)
    assert record.num_bytes == json_bytes({"text": "héllo"}) + json_bytes([{"a": 1}])
    assert json_bytes("é") == 4  # UTF-8 bytes, not characters: '"', two bytes, '"'
    assert StoredResponse("resp_2", {}, (), WHEN, WHEN, num_bytes=7).num_bytes == 7  # as read back


def test_limits_are_checked() -> None:
    assert ResponseStorageLimits(quota_bytes=0).quota_bytes == 0  # storing refused, not an error
    with pytest.raises(ValueError, match="quota_bytes"):
        ResponseStorageLimits(quota_bytes=-1)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="retention_s"):
            ResponseStorageLimits(retention_s=bad)
