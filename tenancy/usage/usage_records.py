"""The usage record the gateway's accounting reports, and one tenant's usage over a day.

Next to the usage wing that stores, spools and reports them; the repository passes them through.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import ClassVar

from pydantic import ConfigDict

from weir.engine.request import FinishReason
from weir.tenancy.errors import FieldError
from weir.tenancy.quota_limits import MAX_INT32
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.store.field_rules import check_aware, validate_tenant_name
from weir.tenancy.store.models import MODEL_VERSION_ID_LEN, USER_LEN

ENDPOINT_RE = re.compile(
    r"[a-z][a-z._]{0,31}"
)  # a usage record's endpoint (weir.tenancy.store.models.ENDPOINT_LEN)


@dataclass(frozen=True)
class UsageRecordIn:
    """One request's usage, as the gateway's accounting reports it (completed, failed or cancelled).

    The one declaration of the usage record: the database row is written from it
    (`weir.tenancy.repository.repo`), and the spool's JSON lines are generated from it by pydantic
    (`weir.tenancy.usage.usage_codec`; strict, so a line of another shape is refused, never coerced).
    """

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(strict=True)

    request_id: str
    tenant_id: str  # the tenant's name, as in TenantContext.tenant_id
    key_id: str | None
    model: str  # the model name the client asked for
    status: UsageStatus
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    ttft_ms: float | None = None  # None: no token was produced
    e2e_ms: float | None = None
    finish_reason: FinishReason | None = None
    created_at: dt.datetime | None = None  # None: now
    # The id (name@version) of the model version that generated the tokens; None: not known.
    model_version: str | None = None
    user: str | None = None  # the request's `user` field (the client's end user), at most 256 chars
    # The LoRA adapter the request ran through (its name); None: the base model.
    adapter: str | None = None
    # The API the request came through (`chat.completion`, `message`, `response`, ...); None: not known.
    endpoint: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not 1 <= len(self.request_id) <= 128:
            raise FieldError("request_id", "must be a string of 1-128 characters")
        validate_tenant_name(self.tenant_id, "tenant_id")
        if not isinstance(self.model, str) or not 1 <= len(self.model) <= 256:
            raise FieldError("model", "must be a string of 1-256 characters")
        if self.model_version is not None and (
            not isinstance(self.model_version, str)
            or not 1 <= len(self.model_version) <= MODEL_VERSION_ID_LEN
        ):
            raise FieldError(
                "model_version", f"must be a string of 1-{MODEL_VERSION_ID_LEN} characters or None"
            )
        if self.user is not None and (not isinstance(self.user, str) or len(self.user) > USER_LEN):
            raise FieldError("user", f"must be a string of at most {USER_LEN} characters or None")
        if self.adapter is not None and (
            not isinstance(self.adapter, str) or not 1 <= len(self.adapter) <= 128
        ):
            raise FieldError("adapter", "must be a string of 1-128 characters or None")
        if self.endpoint is not None and (
            not isinstance(self.endpoint, str) or ENDPOINT_RE.fullmatch(self.endpoint) is None
        ):
            raise FieldError("endpoint", "must be 1-32 lowercase letters, dots or underscores, or None")
        if not isinstance(self.status, UsageStatus):
            raise FieldError("status", "must be a UsageStatus")
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT32:
                raise FieldError(name, "must be a non-negative integer")
        if self.cached_tokens > self.prompt_tokens:
            raise FieldError("cached_tokens", "cannot exceed prompt_tokens")
        for name in ("ttft_ms", "e2e_ms"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise FieldError(name, "must be a non-negative finite number or None")
        if self.finish_reason is not None and not isinstance(self.finish_reason, FinishReason):
            raise FieldError("finish_reason", "must be a FinishReason or None")
        check_aware(self.created_at, "created_at")


# The names reports and CSV files give `DailyUsage.counts()`, in its order.
COUNT_MEASURES = (
    "requests",
    "completed",
    "failed",
    "cancelled",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
)


@dataclass(frozen=True)
class DailyUsage:
    """A tenant's usage over one UTC day."""

    day: dt.date
    num_requests: int
    num_completed: int
    num_failed: int
    num_cancelled: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def counts(self) -> tuple[int, int, int, int, int, int, int]:
        """The day's request counts and token sums, named by `COUNT_MEASURES`."""
        return (
            self.num_requests,
            self.num_completed,
            self.num_failed,
            self.num_cancelled,
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        )
