"""Usage records as single JSON lines, for the usage spool (and its `rejected.jsonl`).

One record is one line: a JSON object with a format version `v`, ending in a newline. A line
that does not decode (a torn write at a crash, a flipped byte) raises `CorruptRecordError`.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from engine.request import FinishReason
from tenancy.enums import UsageStatus
from tenancy.errors import TenancyError
from tenancy.records import UsageRecordIn

FORMAT_VERSION = 1


class CorruptRecordError(ValueError):
    """A spooled line is not a usage record this version can read."""


def record_json(record: UsageRecordIn, **extra: str) -> dict[str, Any]:
    """The JSON object of one record; `extra` adds fields (e.g. why the database refused it)."""
    return {
        "v": FORMAT_VERSION,
        "request_id": record.request_id,
        "tenant_id": record.tenant_id,
        "key_id": record.key_id,
        "model": record.model,
        "status": record.status.value,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cached_tokens": record.cached_tokens,
        "ttft_ms": record.ttft_ms,
        "e2e_ms": record.e2e_ms,
        "finish_reason": None if record.finish_reason is None else record.finish_reason.value,
        "created_at": None if record.created_at is None else record.created_at.isoformat(),
        "model_version": record.model_version,
        "user": record.user,
        "adapter": record.adapter,
        **extra,
    }


def encode_record(record: UsageRecordIn, **extra: str) -> bytes:
    """One line, newline included. ASCII only, so a line never splits a multi-byte character."""
    return json.dumps(record_json(record, **extra), separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def decode_record(line: bytes) -> UsageRecordIn:
    """The record of one line (with or without its newline)."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or obj.get("v") != FORMAT_VERSION:
            raise CorruptRecordError(f"not a version-{FORMAT_VERSION} usage record")
        created_at = obj["created_at"]
        finish = obj["finish_reason"]
        return UsageRecordIn(
            request_id=obj["request_id"],
            tenant_id=obj["tenant_id"],
            key_id=obj["key_id"],
            model=obj["model"],
            status=UsageStatus(obj["status"]),
            prompt_tokens=obj["prompt_tokens"],
            completion_tokens=obj["completion_tokens"],
            cached_tokens=obj["cached_tokens"],
            ttft_ms=obj["ttft_ms"],
            e2e_ms=obj["e2e_ms"],
            finish_reason=None if finish is None else FinishReason(finish),
            created_at=None if created_at is None else dt.datetime.fromisoformat(created_at),
            # Absent in lines spooled before model versions existed.
            model_version=obj.get("model_version"),
            user=obj.get("user"),  # absent in lines spooled before issue 25
            adapter=obj.get("adapter"),  # absent in lines spooled before adapters existed
        )
    except CorruptRecordError:
        raise
    except (ValueError, KeyError, TypeError, TenancyError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptRecordError(f"{type(exc).__name__}: {exc}") from None
