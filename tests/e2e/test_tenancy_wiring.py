"""The gateway wired to tenancy as `weir serve` wires it: keys, quotas, usage records in the DB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

ADMIN = {"authorization": "Bearer admin-secret"}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def wired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeEngine, str]]:
    data_dir: Path = tmp_path_factory.mktemp("weir")
    settings = Settings(data_dir=data_dir, admin_token="admin-secret", auth=AuthMode.KEYS)
    tenancy = build_tenancy(settings)
    engine = FakeEngine()
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        extra_routes=tenancy.routes,
        on_startup=[tenancy.start] if tenancy.start else [],
        on_shutdown=[tenancy.close] if tenancy.close else [],
    )
    with serve_in_thread(app) as url:
        yield engine, url


def test_keys_quotas_and_usage(wired: tuple[FakeEngine, str]) -> None:
    engine, url = wired
    with httpx.Client(base_url=url, headers=ADMIN) as admin:
        assert admin.post(
            "/admin/v1/tenants", json={"name": "acme", "quota": {"max_output_tokens": 4}}
        ).status_code in (200, 201)
        key = admin.post("/admin/v1/tenants/acme/keys", json={}).json()["key"]
    with openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.completion_tokens == 4  # the quota caps the default
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert engine.requests[-1].tenant_id == "acme" and engine.requests[-1].cache_scope == "acme"

    def usage() -> dict[str, object]:
        with httpx.Client(base_url=url, headers=ADMIN) as admin:
            return admin.get("/admin/v1/tenants/acme/usage").json()["total"]

    assert wait_until(lambda: usage()["requests"] == 1, 15)
    total = usage()
    assert total["completed"] == 1 and total["completion_tokens"] == 4
    assert total["prompt_tokens"] == r.usage.prompt_tokens


def test_a_usage_only_key_cannot_generate(wired: tuple[FakeEngine, str]) -> None:
    engine, url = wired
    with httpx.Client(base_url=url, headers=ADMIN) as admin:
        admin.post("/admin/v1/tenants", json={"name": "reader"})
        key = admin.post("/admin/v1/tenants/reader/keys", json={"scopes": ["usage"]}).json()["key"]
    calls = len(engine.requests)
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert len(engine.requests) == calls  # never reached the engine
    r = httpx.get(url + "/v1/usage", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200
