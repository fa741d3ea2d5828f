"""tenancy/usage/usage_codec.py: the model version travels through the spool; older lines still decode."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from sqlalchemy import select

from weir.engine.request import FinishReason
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.models import UsageRecord
from weir.tenancy.usage.usage_codec import CorruptRecordError, decode_record, encode_record, record_json
from weir.tenancy.usage.usage_records import UsageRecordIn

WHEN = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


def _record(model_version: str | None) -> UsageRecordIn:
    return UsageRecordIn(
        request_id="req-1",
        tenant_id="acme",
        key_id=None,
        model="smol",
        status=UsageStatus.COMPLETED,
        prompt_tokens=10,
        completion_tokens=3,
        finish_reason=FinishReason.LENGTH,
        created_at=WHEN,
        model_version=model_version,
    )


@pytest.mark.parametrize("model_version", ["smol@v2", None])
def test_the_model_version_survives_the_round_trip(model_version: str | None) -> None:
    line = encode_record(_record(model_version))
    assert json.loads(line)["model_version"] == model_version
    assert decode_record(line) == _record(model_version)


@pytest.mark.parametrize("user", ["bob", "zoë 東京", 'a "quoted"\nline', None])
def test_every_line_is_the_json_modules_ascii_line(user: str | None) -> None:
    record = dataclasses.replace(_record("smol@v2"), user=user, ttft_ms=1.25, e2e_ms=3.5)
    line = encode_record(record)  # pydantic's dump_json, or the json path for non-ASCII text
    expected = json.dumps(record_json(record), separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
    assert line == expected
    assert line.isascii() and line.count(b"\n") == 1
    assert decode_record(line) == record


def test_the_version_is_checked_however_the_line_is_spaced() -> None:
    obj = json.loads(encode_record(_record(None)))
    assert decode_record(json.dumps(obj).encode()) == _record(None)  # '{"v": 1, ...}': the slow check
    for version in (10, 2, "1"):
        with pytest.raises(CorruptRecordError, match="version-1"):
            decode_record(json.dumps({**obj, "v": version}, separators=(",", ":")).encode())


def test_a_line_spooled_before_model_versions_still_decodes() -> None:
    old = json.loads(encode_record(_record(None)))
    del old["model_version"]
    decoded = decode_record(json.dumps(old).encode())
    assert decoded.model_version is None
    assert decoded == _record(None)


@pytest.mark.parametrize("bad", [7, "", "x" * 194, ["smol@v1"]], ids=repr)
def test_a_malformed_model_version_is_a_corrupt_line(bad: object) -> None:
    obj = json.loads(encode_record(_record(None)))
    obj["model_version"] = bad
    with pytest.raises(CorruptRecordError, match="model_version"):
        decode_record(json.dumps(obj).encode())


def test_the_usage_row_stores_the_model_version(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    repo.record_usages([_record("smol@v2"), dataclasses.replace(_record(None), request_id="r2")])
    with repo.db.transaction() as session:
        rows = session.execute(select(UsageRecord.request_id, UsageRecord.model_version)).tuples()
        stored = {request_id: version for request_id, version in rows}
    assert stored == {"req-1": "smol@v2", "r2": None}


def test_the_adapter_survives_the_spool_and_is_stored(repo: TenancyRepo) -> None:
    record = dataclasses.replace(_record("smol@v2"), adapter="acme-support")
    line = encode_record(record)
    assert decode_record(line) == record
    old = json.loads(line)
    del old["adapter"]  # spooled before adapters existed
    assert decode_record(json.dumps(old).encode()).adapter is None
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    repo.record_usages([record, dataclasses.replace(_record(None), request_id="r2")])
    with repo.db.transaction() as session:
        rows = session.execute(select(UsageRecord.request_id, UsageRecord.adapter)).tuples()
        stored = {request_id: adapter for request_id, adapter in rows}
    assert stored == {"req-1": "acme-support", "r2": None}


def test_the_endpoint_survives_the_spool_and_is_stored(repo: TenancyRepo) -> None:
    record = dataclasses.replace(_record("smol@v2"), endpoint="response")
    line = encode_record(record)
    assert decode_record(line) == record
    old = json.loads(line)
    del old["endpoint"]  # spooled before endpoints were recorded
    assert decode_record(json.dumps(old).encode()).endpoint is None
    repo.create_tenant(TenantSpec(name="acme"), actor="test")
    repo.record_usages([record, dataclasses.replace(_record(None), request_id="r2", endpoint="message")])
    with repo.db.transaction() as session:
        rows = session.execute(select(UsageRecord.request_id, UsageRecord.endpoint)).tuples()
        stored = {request_id: endpoint for request_id, endpoint in rows}
    assert stored == {"req-1": "response", "r2": "message"}


@pytest.mark.parametrize("bad", ["", "Chat", "chat completion", "x" * 33, 7])
def test_a_malformed_endpoint_is_refused(bad: object) -> None:
    from weir.tenancy.errors import FieldError

    with pytest.raises(FieldError, match="endpoint"):
        dataclasses.replace(_record(None), endpoint=bad)
