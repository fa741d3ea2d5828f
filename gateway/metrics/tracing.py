"""OpenTelemetry tracing of generation requests, with a TracerProvider per app (never the global).

One request gives a server span with children `admission` (timed live) and `queue`, `prefill`,
`decode` (placed afterwards from the engine's request metrics, which carry the phase boundaries).
An incoming W3C `traceparent` header makes the request span a child of the caller's span.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from weir.gateway.settings.settings import OtelExporter

_PROPAGATOR = TraceContextTextMapPropagator()


def build_tracer_provider(
    exporter: OtelExporter, endpoint: str | None = None, service_name: str = "weir"
) -> TracerProvider | None:
    """A provider exporting to `exporter`; None when tracing is off (then spans cost nothing)."""
    if exporter is OtelExporter.NONE:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is OtelExporter.CONSOLE:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        # Imported here: the OTLP exporter pulls in protobuf, which only OTLP users should pay for.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def _epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns


class RequestSpan:
    """The span of one request. A disabled tracer hands out one whose methods do nothing."""

    def __init__(self, tracer: trace.Tracer | None, span: trace.Span | None) -> None:
        self._tracer = tracer
        self._span = span

    @property
    def enabled(self) -> bool:
        return self._span is not None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes)

    @contextlib.contextmanager
    def child(self, name: str) -> Iterator[None]:
        """A live child span (e.g. `admission`); an exception marks it as an error."""
        if self._tracer is None or self._span is None:
            yield
            return
        context = trace.set_span_in_context(self._span)
        with self._tracer.start_as_current_span(name, context=context):
            yield

    def record_phases(
        self, arrival_s: float, queue_s: float | None, ttft_s: float | None, e2e_s: float | None
    ) -> None:
        """Add `queue`, `prefill` and `decode` spans from monotonic arrival and offsets (seconds)."""
        if self._tracer is None or self._span is None:
            return
        offset_ns = time.time_ns() - time.monotonic_ns()
        context = trace.set_span_in_context(self._span)
        bounds = [("queue", 0.0, queue_s), ("prefill", queue_s or 0.0, ttft_s), ("decode", ttft_s, e2e_s)]
        for name, start, end in bounds:
            if start is None or end is None or end < start:
                continue
            span = self._tracer.start_span(
                name, context=context, start_time=_epoch_ns(arrival_s + start, offset_ns)
            )
            span.end(end_time=_epoch_ns(arrival_s + end, offset_ns))

    def end(self, error_message: str | None = None) -> None:
        """Close the span; an error message marks it failed."""
        if self._span is None:
            return
        if error_message is not None:
            self._span.set_status(Status(StatusCode.ERROR, error_message))
        self._span.end()


_DISABLED = RequestSpan(None, None)


class RequestTracer:
    """Starts request spans on one app's provider; with no provider it is a no-op."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("weir.gateway") if provider is not None else None

    def start_request(
        self, name: str, headers: Mapping[str, str], attributes: Mapping[str, AttributeValue]
    ) -> RequestSpan:
        """A server span for one HTTP request, child of an incoming `traceparent` if any."""
        if self._tracer is None:
            return _DISABLED
        parent = _PROPAGATOR.extract(carrier=headers)
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return RequestSpan(self._tracer, span)

    def shutdown(self) -> None:
        """Flush and stop the exporters."""
        if self.provider is not None:
            self.provider.shutdown()
