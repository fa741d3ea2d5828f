"""Spans for request, admission, queue, prefill and decode; W3C traceparent is honoured."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.gateway.metrics.tracing import RequestTracer, build_tracer_provider
from weir.gateway.settings.settings import OtelExporter

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[InMemorySpanExporter, httpx.Client]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = make_app(FakeEngine(token_delay_s=0.001), tracer_provider=provider)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        yield exporter, client


def test_request_spans_with_phases_and_incoming_traceparent(
    traced: tuple[InMemorySpanExporter, httpx.Client],
) -> None:
    exporter, client = traced
    exporter.clear()
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 3,
            "stream": True,
        },
        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
    )
    assert r.status_code == 200
    assert wait_until(lambda: any(s.name.startswith("POST") for s in exporter.get_finished_spans()))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["POST /v1/chat/completions"]
    assert root.kind is SpanKind.SERVER
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_ID
    for name in ("admission", "queue", "prefill", "decode"):
        assert spans[name].parent is not None and spans[name].parent.span_id == root.context.span_id, name
        assert spans[name].context.trace_id == root.context.trace_id
    assert spans["queue"].end_time <= spans["prefill"].end_time <= spans["decode"].end_time  # type: ignore[operator]
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.attributes["weir.tenant"] == "default"
    assert root.attributes["weir.outcome"] == "completed"


def test_failed_requests_are_error_spans(traced: tuple[InMemorySpanExporter, httpx.Client]) -> None:
    exporter, client = traced
    exporter.clear()
    r = client.post(
        "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.parent is None  # no traceparent: a new trace


def test_exporter_choice() -> None:
    assert build_tracer_provider(OtelExporter.NONE) is None
    console = build_tracer_provider(OtelExporter.CONSOLE)
    otlp = build_tracer_provider(OtelExporter.OTLP, "http://127.0.0.1:4318/v1/traces")
    assert isinstance(console, TracerProvider) and isinstance(otlp, TracerProvider)
    console.shutdown()
    otlp.shutdown()


def test_disabled_tracer_is_a_no_op() -> None:
    span = RequestTracer(None).start_request("x", {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, {})
    assert not span.enabled
    with span.child("admission"):
        pass
    span.record_phases(0.0, 0.1, 0.2, 0.3)
    span.end("error")
