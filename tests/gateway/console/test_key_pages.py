"""The console's key page and a key's own limits (gateway/console/key_pages.py)."""

from __future__ import annotations

from typing import Any

from tests.gateway.console.console_harness import (
    HOSTILE,
    UI,
    Console,
)
from weir.tenancy.repository.records import KeySpec, TenantSpec


def test_a_keys_own_limits_are_shown_and_set_within_its_tenant(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    key_id = console.repo.issue_key("acme", KeySpec(), actor="test").view.id
    csrf = console.login()
    tenant_page = console.client.get(f"{UI}/tenants/acme")
    assert f'href="{UI}/keys/{key_id}"' in tenant_page.text and "the tenant's" in tenant_page.text
    page = console.client.get(f"{UI}/keys/{key_id}")
    assert page.status_code == 200 and 'id="kl-tokens_per_minute"' in page.text
    saved: Any = console.post(f"/keys/{key_id}/limits", csrf, tokens_per_minute="500", models="m, n")
    assert saved.status_code == 200 and "Key limits saved." in saved.text
    stored = console.repo.get_key(key_id).limits
    assert stored.tokens_per_minute == 500 and stored.models == ("m", "n")
    assert "tokens per minute 500" in console.client.get(f"{UI}/tenants/acme").text
    for bad in ({"tokens_per_minute": "0"}, {"max_concurrent": "lots", "models": HOSTILE}):
        refused: Any = console.post(f"/keys/{key_id}/limits", csrf, **bad)
        assert refused.status_code in (400, 422), (bad, refused.status_code)
        assert HOSTILE not in refused.text and 'role="alert"' in refused.text
    assert console.repo.get_key(key_id).limits.tokens_per_minute == 500  # unchanged by the refusals
    # A model name is any string: markup is stored as given and shown as text.
    hostile: Any = console.post(f"/keys/{key_id}/limits", csrf, models=HOSTILE)
    assert hostile.status_code == 200 and HOSTILE not in hostile.text and "&lt;script&gt;" in hostile.text
    assert HOSTILE not in console.client.get(f"{UI}/tenants/acme").text
    cleared: Any = console.post(f"/keys/{key_id}/limits", csrf)
    assert cleared.status_code == 200 and console.repo.get_key(key_id).limits.tokens_per_minute is None
    assert console.client.get(f"{UI}/keys/sk-not-an-id").status_code == 404
    assert console.post(f"/keys/{key_id}/limits", None, tokens_per_minute="1").status_code == 403  # type: ignore[attr-defined]
