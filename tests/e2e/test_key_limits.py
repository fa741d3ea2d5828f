"""Keys as principals, end to end as `weir serve` wires them: admin API -> database -> auth ->
admission, read back by the official openai client (rate-limit headers, 429 with Retry-After)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread
from weir.gateway.admission.controller import build_admission
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

ADMIN = {"authorization": "Bearer admin-secret"}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    settings = Settings(data_dir=tmp_path, admin_token="admin-secret", auth=AuthMode.KEYS)
    tenancy = build_tenancy(settings)
    engine = FakeEngine()
    engine.eos_after = 2
    metrics = GatewayMetrics(engine.stats)
    admission = build_admission(settings, engine.stats, AdmissionMetrics(metrics.registry))
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        admission=admission,
        metrics=metrics,
        extra_routes=tenancy.routes,
        on_startup=[h for h in (tenancy.start, admission.start) if h is not None],
        on_shutdown=[h for h in (admission.close, tenancy.close) if h is not None],
    )
    with serve_in_thread(app) as url:
        yield url


def _tenant_and_key(url: str, quota: dict[str, object], limits: dict[str, object]) -> str:
    with httpx.Client(base_url=url, headers=ADMIN) as admin:
        assert admin.post("/admin/v1/tenants", json={"name": "acme", "quota": quota}).status_code == 201
        issued = admin.post("/admin/v1/tenants/acme/keys", json={}).json()
        r = admin.put(f"/admin/v1/keys/{issued['id']}/limits", json=limits)
        assert r.status_code == 200, r.text
        assert {k: v for k, v in r.json()["limits"].items() if v} == {k: v for k, v in limits.items() if v}
        audit = admin.get("/admin/v1/audit", params={"tenant": "acme"}).json()["data"]
        assert audit[0]["action"] == "key.limits" and audit[0]["target"] == issued["id"]
        return str(issued["key"])


def test_the_openai_client_reads_the_rate_limit_headers_and_a_key_rpm_429(server: str) -> None:
    key = _tenant_and_key(
        server, {"requests_per_minute": 100, "tokens_per_minute": 10_000}, {"requests_per_minute": 2}
    )
    with openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
        assert raw.parse().choices[0].message.content is not None
        h = raw.headers
        # The key's 2 rpm binds before the tenant's 100: the headers report the tighter window.
        assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "1")
        assert h["x-ratelimit-reset-requests"].endswith("s")
        assert h["x-ratelimit-limit-tokens"] == "10000"
        assert int(h["x-ratelimit-remaining-tokens"]) < 10_000
        stream = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=8,
            stream=True,  # type: ignore[arg-type]
        )
        assert stream.headers["x-ratelimit-remaining-requests"] == "0"
        for _ in stream.parse():
            pass
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
    response = info.value.response
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-limit-requests"] == "2"
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "rate_limit_exceeded"
    assert "requests per minute" in body["message"]


def test_a_key_is_narrowed_to_its_models_and_the_tenant_still_binds(server: str) -> None:
    key = _tenant_and_key(server, {"max_output_tokens": 4}, {"max_output_tokens": 100, "models": [MODEL]})
    with openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0) as client:
        # The tenant's 4 binds though the key allows 100: a key can only narrow.
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
        assert [m.id for m in client.models.list()] == [MODEL]
    with httpx.Client(base_url=server, headers=ADMIN) as admin:
        key_id = admin.get("/admin/v1/tenants/acme/keys").json()["data"][0]["id"]
        r = admin.put(f"/admin/v1/keys/{key_id}/limits", json={"models": ["other-model"]})
        assert r.status_code == 200  # the tenant allows every model
        r = admin.put(f"/admin/v1/keys/{key_id}/limits", json={"requests_per_minute": 0})
        assert r.status_code == 422 and "requests_per_minute" in r.json()["error"]["message"]
        r = admin.put(f"/admin/v1/keys/{key_id}/limits", json={"ttft_slo_ms": 5})
        assert r.status_code == 422
    with openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0) as client:
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
