"""Defect 7: `/metrics` names every tenant, so only the operator may read it.

Through a real `weir serve` (a child process, tiny random model, keys on): on the API port
`/metrics` answers 401 with an OpenAI-shaped body without the admin token (a tenant key is not
enough) and 200 with it; the metrics listener (`--metrics-port`) answers 200 and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.engine.tiny_models import make_tiny_model
from weir_bench.weir_process import WeirProcess, run_weir


@pytest.fixture(scope="module")
def weir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    root = tmp_path_factory.mktemp("metrics-exposure")
    model = make_tiny_model(root / "model", arch="llama", num_kv_heads=2, max_position_embeddings=256)
    with run_weir(model, root / "data", ["--kv-cache-tokens", "2048", "--device", "cpu"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def tenant_key(weir: WeirProcess) -> str:
    headers = weir.admin_headers()
    r = httpx.post(weir.url + "/admin/v1/tenants", json={"name": "secret-customer"}, headers=headers)
    assert r.status_code in (200, 201), r.text
    r = httpx.post(weir.url + "/admin/v1/tenants/secret-customer/keys", json={}, headers=headers)
    assert r.status_code in (200, 201), r.text
    key = r.json()["key"]
    assert isinstance(key, str)
    return key


def _assert_openai_error(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "secret-customer" not in resp.text


def test_api_port_metrics_need_the_admin_token(weir: WeirProcess, tenant_key: str) -> None:
    _assert_openai_error(httpx.get(weir.url + "/metrics"), 401)
    _assert_openai_error(
        httpx.get(weir.url + "/metrics", headers={"authorization": f"Bearer {tenant_key}"}), 401
    )
    _assert_openai_error(httpx.get(weir.url + "/metrics", headers={"authorization": "Bearer nope"}), 401)
    ok = httpx.get(weir.url + "/metrics", headers=weir.admin_headers())
    assert ok.status_code == 200
    assert "weir_kv_cache_total_blocks" in ok.text


def test_metrics_port_serves_metrics_and_nothing_else(weir: WeirProcess, tenant_key: str) -> None:
    r = httpx.post(
        weir.url + "/v1/completions",
        json={"model": "model", "prompt": "hello", "max_tokens": 2},
        headers={"authorization": f"Bearer {tenant_key}"},
    )
    assert r.status_code == 200, r.text
    scrape = httpx.get(weir.metrics_url)
    assert scrape.status_code == 200
    assert 'tenant="secret-customer"' in scrape.text
    root = weir.metrics_url.removesuffix("/metrics")
    for path in ("/v1/models", "/admin/v1/tenants", "/health"):
        _assert_openai_error(httpx.get(root + path, headers=weir.admin_headers()), 404)
