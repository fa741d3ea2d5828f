"""Usage records as single JSON lines, for the usage spool (and its `rejected.jsonl`).

One record is one line: a JSON object with a format version `v`, ending in a newline. The
fields are `weir.tenancy.usage.usage_records.UsageRecordIn`'s, encoded and decoded by pydantic from that one
declaration (a field added there travels through the spool with no edit here; give it a default
so that lines spooled before it still decode). A line that does not decode (a torn write at a
crash, a flipped byte) raises `CorruptRecordError`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from weir.tenancy.errors import TenancyError
from weir.tenancy.usage.usage_records import UsageRecordIn

FORMAT_VERSION = 1
_RECORD: TypeAdapter[UsageRecordIn] = TypeAdapter(UsageRecordIn)
_LINE_HEAD = b'{"v":%d,' % FORMAT_VERSION


class CorruptRecordError(ValueError):
    """A spooled line is not a usage record this version can read."""


def record_json(record: UsageRecordIn, **extra: str) -> dict[str, Any]:
    """The JSON object of one record; `extra` adds fields (e.g. why the database refused it)."""
    return {"v": FORMAT_VERSION, **_RECORD.dump_python(record, mode="json"), **extra}


def encode_record(record: UsageRecordIn, **extra: str) -> bytes:
    """One line, newline included. ASCII only, so a line never splits a multi-byte character.

    pydantic's `dump_json` (Rust) writes the common line, ~3x faster than `json.dumps` over
    `dump_python` (a stream's first record is encoded on the event loop); a record it cannot
    write as ASCII (non-ASCII text, a lone surrogate), or one with `extra` fields, takes the
    `json` path.
    """
    if not extra:
        try:
            body = _RECORD.dump_json(record)  # '{"request_id":...}'
        except PydanticSerializationError:
            pass
        else:
            if body.isascii():
                return _LINE_HEAD + body[1:] + b"\n"
    return json.dumps(record_json(record, **extra), separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def decode_record(line: bytes) -> UsageRecordIn:
    """The record of one line (with or without its newline); fields it does not know are ignored
    (e.g. the reason `rejected.jsonl` adds)."""
    try:
        if not line.startswith(_LINE_HEAD):  # as `encode_record` writes it: one parse, not two
            obj = json.loads(line)
            if not isinstance(obj, dict) or obj.get("v") != FORMAT_VERSION:
                raise CorruptRecordError(f"not a version-{FORMAT_VERSION} usage record")
        return _RECORD.validate_json(line)
    except CorruptRecordError:
        raise
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        raise CorruptRecordError(f"{where}: {error['msg']}") from None
    except (ValueError, TenancyError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptRecordError(f"{type(exc).__name__}: {exc}") from None
