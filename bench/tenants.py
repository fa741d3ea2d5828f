"""Per-tenant API keys for a run: read from a tenants file, or created through the admin API.

The tenants file is a JSON list like `shared/workloads/tenants.json`:
`[{"name", "priority", "weight", "quota": {...}, "cache_scope"?, "api_key"?}]`. With `--create-tenants`
each tenant is created (`POST /admin/v1/tenants`; an existing one is kept) and given a fresh key
(`POST /admin/v1/tenants/{name}/keys` -> `{"id", "key"}`); otherwise `api_key` must be there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.workloads import PRIORITIES

_ALLOWED_FIELDS = {"name", "priority", "weight", "quota", "cache_scope", "api_key"}


class TenantSetupError(RuntimeError):
    """The admin API refused to create a tenant or a key."""


@dataclass(frozen=True)
class TenantSpec:
    """One tenant of the tenants file."""

    name: str
    priority: str = "standard"
    weight: float = 1.0
    quota: Mapping[str, Any] = field(default_factory=dict)  # passed to the admin API as is
    cache_scope: str | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority of tenant {self.name!r} must be one of {', '.join(PRIORITIES)}")
        if self.weight <= 0:
            raise ValueError(f"weight of tenant {self.name!r} must be > 0")

    def admin_body(self) -> dict[str, Any]:
        """Body of POST /admin/v1/tenants."""
        body = {
            "name": self.name,
            "priority": self.priority,
            "weight": self.weight,
            "quota": dict(self.quota),
        }
        if self.cache_scope is not None:
            body["cache_scope"] = self.cache_scope
        return body


def parse_tenants(data: Any) -> list[TenantSpec]:
    """Tenants from the decoded file; raises ValueError naming the bad entry or field."""
    if not isinstance(data, list):
        raise ValueError("a tenants file must hold a JSON list")
    specs = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"tenant entry {i} needs a string name")
        unknown = set(entry) - _ALLOWED_FIELDS
        if unknown:
            raise ValueError(f"tenant {entry['name']!r}: unknown fields {sorted(unknown)}")
        quota = entry.get("quota", {})
        if not isinstance(quota, dict):
            raise ValueError(f"quota of tenant {entry['name']!r} must be an object")
        weight = entry.get("weight", 1.0)
        if not isinstance(weight, int | float):
            raise ValueError(f"weight of tenant {entry['name']!r} must be a number")
        specs.append(
            TenantSpec(
                name=entry["name"],
                priority=entry.get("priority", "standard"),
                weight=float(weight),
                quota=quota,
                cache_scope=entry.get("cache_scope"),
                api_key=entry.get("api_key"),
            )
        )
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("tenant names must be unique")
    return specs


def load_tenants(path: str | Path) -> list[TenantSpec]:
    """Read a tenants file."""
    with open(path, encoding="utf-8") as f:
        return parse_tenants(json.load(f))


def keys_from_file(specs: Sequence[TenantSpec]) -> dict[str, str]:
    """The keys written in the file (tenants without one are left out)."""
    return {s.name: s.api_key for s in specs if s.api_key}


async def create_tenants(
    client: httpx.AsyncClient, server_root: str, admin_token: str, specs: Sequence[TenantSpec]
) -> dict[str, str]:
    """Create every tenant (kept if it exists: 409) and a new API key for each; tenant -> key."""
    headers = {"authorization": f"Bearer {admin_token}"}
    keys: dict[str, str] = {}
    for spec in specs:
        resp = await client.post(f"{server_root}/admin/v1/tenants", json=spec.admin_body(), headers=headers)
        if resp.status_code not in (200, 201, 409):
            raise TenantSetupError(
                f"creating tenant {spec.name!r}: HTTP {resp.status_code}: {resp.text[:500]}"
            )
        resp = await client.post(f"{server_root}/admin/v1/tenants/{spec.name}/keys", json={}, headers=headers)
        if resp.status_code not in (200, 201):
            raise TenantSetupError(
                f"creating a key for {spec.name!r}: HTTP {resp.status_code}: {resp.text[:500]}"
            )
        body = resp.json()
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            raise TenantSetupError(f"creating a key for {spec.name!r}: no 'key' in the answer")
        keys[spec.name] = body["key"]
    return keys
