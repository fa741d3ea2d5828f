"""/metrics parses with prometheus_client's parser and the counters move."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import (
    ADMIN_HEADERS,
    MODEL,
    check_admin_token,
    make_app,
    serve_in_thread,
    wait_until,
)
from weir.engine.request import Priority
from weir.gateway.metrics.registry import GatewayMetrics
from weir.tenancy.context import QuotaLimits, TenantContext

ACME = TenantContext("acme", "k1", Priority.STANDARD, 1.0, "acme", QuotaLimits())


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeEngine, httpx.Client]]:
    engine = FakeEngine()

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        return ACME

    with (
        serve_in_thread(make_app(engine, authenticate=authenticate, metrics_auth=check_admin_token)) as url,
        httpx.Client(base_url=url) as client,
    ):
        yield engine, client


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics", headers=ADMIN_HEADERS).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_move(server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = server
    engine.reset()
    before = scrape(client)
    t = {"model": MODEL, "tenant": "acme"}
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "n": 2},
    )
    assert r.status_code == 200
    usage = r.json()["usage"]
    # Accounting runs after the body is sent; wait for it.
    assert wait_until(
        lambda: (
            value(scrape(client), "weir_e2e_request_latency_seconds_count", **t)
            > value(before, "weir_e2e_request_latency_seconds_count", **t)
        )
    )
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("weir_prompt_tokens_total", **t) == usage["prompt_tokens"]
    assert delta("weir_generation_tokens_total", **t) == usage["completion_tokens"] == 8
    assert delta("weir_requests_finished_total", reason="length", **t) == 2
    for hist in ("time_to_first_token", "e2e_request_latency", "request_queue_time", "time_per_output_token"):
        assert delta(f"weir_{hist}_seconds_count", **t) == 1
    assert delta("weir_inter_token_latency_seconds_count", **t) == 3  # 4 tokens of choice 0: 3 gaps


def test_engine_gauges_are_read_at_scrape_time(server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = server
    engine.reset()
    engine.num_free_blocks = engine.num_total_blocks // 4
    engine.num_preemptions = 7
    samples = scrape(client)
    assert value(samples, "weir_kv_cache_usage_ratio") == 0.75
    assert value(samples, "weir_num_preemptions_total") == 7
    assert value(samples, "weir_prefix_cache_hit_rate") == 0.4
    assert ("weir_num_requests_running", ()) in samples and ("weir_num_requests_waiting", ()) in samples
    engine.num_free_blocks = engine.num_total_blocks


def test_errors_are_counted_by_status(server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = server
    before = value(scrape(client), "weir_request_errors_total", status="404")
    client.post(
        "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    )
    assert value(scrape(client), "weir_request_errors_total", status="404") == before + 1


def test_requests_refused_before_the_app_are_counted_too(server: tuple[FakeEngine, httpx.Client]) -> None:
    engine, client = server
    before = value(scrape(client), "weir_request_errors_total", status="431")
    # Refused by the body-limit middleware from the headers alone, before any route runs.
    r = client.get("/v1/models", headers={"x-padding": "a" * 20_000})
    assert r.status_code == 431
    assert value(scrape(client), "weir_request_errors_total", status="431") == before + 1


def test_aborted_choices_count_as_abort() -> None:
    from weir.engine.client import EngineRequest
    from weir.engine.request import SamplingParams
    from weir.gateway.admission.accounting import Accountant, Outcome, RequestInfo, RequestTally
    from weir.gateway.api.protocol import Endpoint
    from weir.gateway.metrics.tracing import RequestTracer

    metrics = GatewayMetrics(FakeEngine().stats)
    request = EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=5))
    tally = RequestTally([request], 1)
    info = RequestInfo("r", Endpoint.CHAT, MODEL, ACME, None, 0.0, request.arrival_s)
    span = RequestTracer(None).start_request("x", {}, {})
    record = Accountant(metrics).finish(info, tally, Outcome.CLIENT_DISCONNECTED, span, lambda r: None)
    assert record.finish_reasons == ("abort",)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics.render()[0].decode())
        for s in f.samples
    }
    assert value(samples, "weir_requests_finished_total", model=MODEL, tenant="acme", reason="abort") == 1
    assert value(samples, "weir_prompt_tokens_total", model=MODEL, tenant="acme") == 3


def test_a_broken_engine_does_not_break_the_scrape() -> None:
    def broken() -> object:
        raise RuntimeError("x")

    metrics = GatewayMetrics(broken)  # type: ignore[arg-type]
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    assert b"weir_time_to_first_token_seconds" in body


def test_registries_are_per_app() -> None:
    a, b = GatewayMetrics(FakeEngine().stats), GatewayMetrics(FakeEngine().stats)
    a.count_error(500)
    assert b'weir_request_errors_total{status="500"}' not in b.render()[0]


def test_api_port_metrics_need_the_metrics_auth(server: tuple[FakeEngine, httpx.Client]) -> None:
    # /metrics names every tenant: without the admin token it is a 401 with an OpenAI-shaped body.
    _, client = server
    for headers in ({}, {"authorization": "Bearer a-tenant-key"}):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "acme" not in r.text
    assert client.get("/metrics", headers=ADMIN_HEADERS).status_code == 200


def test_without_metrics_auth_the_api_port_has_no_metrics() -> None:
    with serve_in_thread(make_app(FakeEngine())) as url:
        r = httpx.get(url + "/metrics", headers=ADMIN_HEADERS)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
