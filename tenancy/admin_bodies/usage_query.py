"""The query parameters of the usage and audit routes, declared as models: the routes parse with
them and `/openapi.json` lists their fields as the operations' parameters.

Query values arrive as strings, so integers here are parsed from text (lax), unlike in bodies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.admin_bodies.fields import Day
from weir.tenancy.keys.keys import PUBLIC_ID_RE
from weir.tenancy.parsing import parse_model
from weir.tenancy.store.audit import MAX_AUDIT_PAGE
from weir.tenancy.store.field_rules import TENANT_NAME_RE
from weir.tenancy.usage.usage_records import ENDPOINT_RE
from weir.tenancy.usage.usage_report import (
    DEFAULT_GROUP_BY,
    DEFAULT_LIMIT,
    GROUPS,
    MAX_LIMIT,
    ReportQuery,
    report_query,
)

MAX_QUERY_INT = 2**63 - 1  # the database stores 64-bit integers; a larger one overflows the driver
QueryInt = Annotated[int, Field(ge=0, le=MAX_QUERY_INT)]
_TIME = "YYYY-MM-DD (midnight UTC) or an ISO 8601 time with a zone"


class UsageQuery(BaseModel):
    """`since` / `until` of a tenant's usage per day (both inclusive, UTC days), of one `endpoint`
    when given."""

    model_config = ConfigDict(extra="ignore")

    since: Day | None = None
    until: Day | None = None
    endpoint: str | None = Field(
        default=None,
        description="Only the records of this endpoint: chat.completion, text_completion, message, "
        "response or tokenize.",
        json_schema_extra={"pattern": f"^{ENDPOINT_RE.pattern}$"},
    )


class AuditQuery(BaseModel):
    """`GET /admin/v1/audit`: a tenant's events, `limit` of them, older than event `before`."""

    model_config = ConfigDict(extra="ignore")

    tenant: str | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_AUDIT_PAGE)] = 100
    before: QueryInt | None = None


class ReportParams(BaseModel):
    """`GET /admin/v1/usage/report`: `[since, until)`, grouped, one page, JSON or CSV."""

    model_config = ConfigDict(extra="forbid")

    since: str = Field(description=_TIME, examples=["2026-03-01", "2026-03-01T12:00:00Z"])
    until: str = Field(description=_TIME + "; exclusive", examples=["2026-03-02"])
    group_by: str = Field(
        default=",".join(DEFAULT_GROUP_BY),
        description="Comma-separated dimensions, each at most once.",
        json_schema_extra={"pattern": f"^({'|'.join(GROUPS)})(,({'|'.join(GROUPS)}))*$"},
    )
    tenant: str | None = Field(default=None, json_schema_extra={"pattern": f"^{TENANT_NAME_RE.pattern}$"})
    key_id: str | None = Field(default=None, json_schema_extra={"pattern": f"^{PUBLIC_ID_RE.pattern}$"})
    endpoint: str | None = Field(
        default=None,
        description="Only the records of this endpoint: chat.completion, text_completion, message, "
        "response or tokenize.",
        json_schema_extra={"pattern": f"^{ENDPOINT_RE.pattern}$"},
    )
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT
    offset: QueryInt = 0
    format: Literal["json", "csv"] = "json"


def parse_report_params(params: Mapping[str, str]) -> tuple[ReportQuery, str]:
    """The query and the format of GET /admin/v1/usage/report's parameters."""
    parsed = parse_model(ReportParams, dict(params))
    return report_query(parsed), parsed.format
