"""Field rules shared by the tables and every record above them: a tenant's name, an aware time.

On the ground floor so the catalog, usage and the repository all check a tenant name the same way.
"""

from __future__ import annotations

import datetime as dt
import re

from weir.tenancy.errors import FieldError

TENANT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def validate_tenant_name(name: object, field_name: str = "name") -> str:
    """A tenant name: 1-64 of [a-z0-9._-], starting with a letter or digit (it appears in URLs)."""
    if not isinstance(name, str) or TENANT_NAME_RE.fullmatch(name) is None:
        raise FieldError(
            field_name,
            "must be 1-64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def check_aware(value: dt.datetime | None, field_name: str) -> None:
    """Refuse a naive datetime: every stored time is aware (UTC in the database)."""
    if value is not None and value.tzinfo is None:
        raise FieldError(field_name, "must include a time zone (e.g. 2030-01-01T00:00:00Z)")
