"""Two real `weir serve` replicas (the real SmolLM2, float32) on one real redis-server.

A prompt computed on replica A is served from the store on replica B: `cached_tokens` reports it
and the greedy answer equals A's cold one. Another tenant asking B the same prompt gets nothing
from the store. Values tampered with in the store are refused (counted) and recomputed; the admin
prefix-cache route reports the store. A paused (SIGSTOP) store, a changed password and then a
stopped store leave every request answered: they recompute. A restarted replica finds its
prefixes in the store again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.harness import wait_until
from tests.redis_server import RedisServer
from weir_bench.weir_process import WeirProcess, run_weir

pytestmark = pytest.mark.slow

SECRET = "e2e-kv-store-mac-secret-0123456789"
SYSTEM = (
    "You are the support assistant of a small bakery. Opening hours are eight to six on weekdays and "
    "nine to one on Saturdays. We sell sourdough, rye, baguettes, croissants and seasonal cakes. "
)
OTHER = (
    "You answer questions about a public library. Members may borrow twelve books for three weeks; "
    "films and games for one week. Late returns cost ten cents a day, and the reading room is quiet. "
)
PROMPTS = [SYSTEM * 6 + "What do you recommend for a picnic?", OTHER * 6 + "Can I renew a film?"]
PROMPTS += [f"Question {i}: " + "how long do loaves keep fresh? " * 30 for i in range(2)]


def _client(replica: WeirProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=replica.url + "/v1", api_key=key, max_retries=0, timeout=300)


def _ask(replica: WeirProcess, key: str, prompt: str) -> tuple[str, int]:
    """Greedy text and cached prompt tokens of one completion."""
    with _client(replica, key) as c:
        done = c.completions.create(model="smol", prompt=prompt, max_tokens=12, temperature=0)
    details = done.usage.prompt_tokens_details if done.usage is not None else None
    return done.choices[0].text, (details.cached_tokens or 0) if details is not None else 0


def _key(replica: WeirProcess, tenant: str) -> str:
    with httpx.Client(base_url=replica.url, headers=replica.admin_headers(), timeout=30) as admin:
        assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
        return str(admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"])


def _metrics(replica: WeirProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(replica.metrics_url, timeout=10).text
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_version"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _written(replica: WeirProcess) -> float:
    return sum(
        v for (name, _), v in _metrics(replica).items() if name == "weir_kv_store_written_blocks_total"
    )


def _store_refusals(replica: WeirProcess) -> float:
    """Fetches that failed, timed out, or were not tried because the breaker was open."""
    got = _metrics(replica)
    return (
        got[("weir_kv_store_errors_total", (("op", "fetch"),))]
        + got[("weir_kv_store_fetch_timeouts_total", ())]
        + got[("weir_kv_store_fetch_decisions_total", (("decision", "breaker_open"),))]
    )


@pytest.fixture
def replicas(
    default_model_dir: Path, redis_server: RedisServer, tmp_path: Path
) -> Iterator[list[WeirProcess]]:
    flags = ["--kv-store", redis_server.url, "--served-model-name", "smol", "--dtype", "float32"]
    flags += ["--kv-cache-tokens", "8192", "--kv-store-timeout-ms", "2000"]
    env = {"WEIR_KV_STORE_SECRET": SECRET}
    with (
        run_weir(default_model_dir, tmp_path / "a", flags, env=env, start_timeout_s=300) as a,
        run_weir(default_model_dir, tmp_path / "b", flags, env=env, start_timeout_s=300) as b,
    ):
        yield [a, b]


def test_a_prompt_computed_on_one_replica_is_served_from_the_store_on_another(
    replicas: list[WeirProcess], redis_server: RedisServer
) -> None:
    a, b = replicas
    acme_a, acme_b, other_b = _key(a, "acme"), _key(b, "acme"), _key(b, "other")

    cold, cached = _ask(a, acme_a, PROMPTS[0])
    assert cached == 0
    assert wait_until(lambda: _written(a) > 0, 30)
    warm, cached = _ask(b, acme_b, PROMPTS[0])
    assert warm == cold
    assert cached >= 16 * 10, "B served the shared system prompt from the store"
    got = _metrics(b)
    assert got[("weir_kv_store_blocks_total", (("result", "hit"),))] * 16 >= cached
    assert got[("weir_kv_store_fetch_decisions_total", (("decision", "fetch"),))] >= 1

    # Another tenant, same prompt: its chain starts from its own scope; nothing to find.
    text, cached = _ask(b, other_b, PROMPTS[0])
    assert cached == 0 and text == cold

    # Tampered values are refused and recomputed: the answer does not change.
    written = _written(a)
    reference, _ = _ask(a, acme_a, PROMPTS[1])
    assert wait_until(lambda: _written(a) >= written + 10, 30)
    r = redis_server.client()
    for key in r.keys("weir:kv:*"):
        value = bytearray(r.get(key))
        value[-40] ^= 0x55  # a byte of KV, not of the MAC
        r.set(key, bytes(value), keepttl=True)
    text, cached = _ask(b, acme_b, PROMPTS[1])
    assert text == reference
    refused = _metrics(b)[("weir_kv_store_refused_blocks_total", (("reason", "bad_mac"),))]
    assert refused >= 1

    # The admin prefix-cache route reports the store as B sees it.
    stats = httpx.get(b.url + "/admin/v1/prefix-cache/stats", headers=b.admin_headers(), timeout=30).json()
    store = stats["store"]
    assert store["breaker_state"] == "closed" and store["hit_blocks"] >= 10 and store["refused_blocks"] >= 1

    # A paused store, one whose password changed, then a stopped one: every request is answered.
    redis_server.pause()
    try:
        t0 = time.monotonic()
        text, cached = _ask(b, acme_b, PROMPTS[2])
        assert text and time.monotonic() - t0 < 120
    finally:
        redis_server.resume()
    r.config_set("requirepass", "rotated-by-the-operator")
    r.client_kill_filter(_type="normal", skipme=True)  # the replicas' connections must log in again
    refused = _store_refusals(b)
    text, cached = _ask(b, acme_b, PROMPTS[3])
    assert text and cached == 0
    assert _store_refusals(b) > refused  # the store refused the login, or the open breaker the call
    redis_server.stop()
    for replica, key in ((a, acme_a), (b, acme_b)):
        text, _ = _ask(replica, key, PROMPTS[3])
        assert text


def test_a_restarted_replica_gets_its_hits_back_from_the_store(
    default_model_dir: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    flags = ["--kv-store", redis_server.url, "--served-model-name", "smol", "--dtype", "float32"]
    flags += ["--kv-store-timeout-ms", "2000"]
    env = {"WEIR_KV_STORE_SECRET": SECRET}
    with run_weir(default_model_dir, tmp_path / "r", flags, env=env, start_timeout_s=300) as first:
        key = _key(first, "acme")
        cold, _ = _ask(first, key, PROMPTS[0])
        assert wait_until(lambda: _written(first) > 0, 30)
    # The same replica after a restart (its data dir, so its tenants and keys): a cold device cache.
    with run_weir(default_model_dir, tmp_path / "r", flags, env=env, start_timeout_s=300) as again:
        text, cached = _ask(again, key, PROMPTS[0])
    assert text == cold and cached >= 16 * 10
