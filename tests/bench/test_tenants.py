"""weir_bench.tenants: the tenants file and key creation through the admin API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from weir_bench.tenants import TenantSetupError, create_tenants, keys_from_file, load_tenants, parse_tenants

SHARED_FORMAT = [
    {"name": "acme", "priority": "interactive", "weight": 1, "quota": {"tokens_per_minute": 2000000}},
    {
        "name": "quiet",
        "priority": "interactive",
        "weight": 2,
        "quota": {"ttft_slo_ms": 2000},
        "api_key": "sk-q",
    },
]


def test_parse_shared_format(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(SHARED_FORMAT))
    specs = load_tenants(path)
    assert [s.name for s in specs] == ["acme", "quiet"]
    assert specs[0].admin_body() == {
        "name": "acme", "priority": "interactive", "weight": 1.0, "quota": {"tokens_per_minute": 2000000},
    }  # fmt: skip
    assert keys_from_file(specs) == {"quiet": "sk-q"}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"name": "a"}, "list"),
        ([{"priority": "batch"}], "name"),
        ([{"name": "a", "priority": "vip"}], "priority"),
        ([{"name": "a", "weight": 0}], "weight"),
        ([{"name": "a", "quota": 5}], "quota"),
        ([{"name": "a", "colour": "red"}], "unknown"),
        ([{"name": "a"}, {"name": "a"}], "unique"),
    ],
)
def test_bad_files(data: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_tenants(data)


def test_create_tenants_and_keys(fake_server) -> None:
    specs = parse_tenants(SHARED_FORMAT)

    async def go(token: str) -> dict[str, str]:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await create_tenants(client, fake_server.root, token, specs)

    first = asyncio.run(go("admin-secret"))
    assert set(first) == {"acme", "quiet"} and all(k.startswith("sk-") for k in first.values())
    again = asyncio.run(go("admin-secret"))  # tenants exist (409): kept, new keys
    assert again != first
    with pytest.raises(TenantSetupError, match="401"):
        asyncio.run(go("wrong"))
