"""OpenTelemetry tracing (the extra ``narwhal[otel]``): each sampled request, once finished,
goes to the SDK's ``BatchSpanProcessor``, whose thread exports it over OTLP/HTTP
(``observe.otlp``).

What the event loop pays per request is small and fixed: the request's hooks record moments,
and at the end one SDK span (the server span) is queued. That span carries a ``render()``
that builds the request's spans, attributes and all (``Observation.render``), which the
exporter calls in its own thread. An exporter other than Narwhal's would see the server
spans only, without attributes.

The SDK is imported only when a ``Tracer`` is made, so Narwhal runs without the extra while
``tracing`` is off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from narwhal.config import Tracing
from narwhal.observe.otlp import Encoder, OtlpHttpExporter, SpanData
from narwhal.observe.tracecontext import Sampler, TraceContext

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

EXTRA_HINT = "install the extra: pip install 'narwhal[otel]'"
SCHEDULE_DELAY_MS = 500
CLOSE_TIMEOUT_S = 5.0
MAX_QUEUE = 4096
"""Requests waiting for export; past it new ones are dropped (the collector is down or slow)."""

Render = Callable[[], Sequence[SpanData]]


class TracingUnavailable(RuntimeError):
    """``tracing`` is configured but the OpenTelemetry SDK (``narwhal[otel]``) is missing."""


def check_tracing(config: Tracing) -> None:
    """At start-up, before any worker: raise TracingUnavailable naming the extra when
    ``tracing.otlp_endpoint`` is set and the SDK cannot be imported."""
    if config.otlp_endpoint is None:
        return
    try:
        import opentelemetry.sdk.trace.export  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing.otlp_endpoint is set but the OpenTelemetry SDK is not installed; "
            + EXTRA_HINT
        ) from exc


def _request_span_class() -> Callable[..., ReadableSpan]:
    """The SDK's ``ReadableSpan`` that also renders the request's spans (made with the first
    Tracer: the SDK is imported only then)."""
    from opentelemetry.sdk.trace import ReadableSpan

    class RequestSpan(ReadableSpan):
        """A finished request's server span; ``render()`` gives it and its children."""

        def __init__(self, render: Render, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.render = render

    return RequestSpan


class Tracer:
    """One worker process's tracing: the sampler and the export pipeline."""

    def __init__(self, config: Tracing, *, version: str) -> None:
        check_tracing(config)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

        assert config.otlp_endpoint is not None
        self.sampler = Sampler(config.sample_ratio)
        # service.name, and what OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME add
        self.resource = Resource.create({"service.name": config.service_name,
                                         "service.version": version})
        self.scope = InstrumentationScope("narwhal", version)
        self.exporter = OtlpHttpExporter(
            config.otlp_endpoint, Encoder(self.resource.attributes, "narwhal", version))
        self.processor: BatchSpanProcessor = BatchSpanProcessor(
            cast("SpanExporter", self.exporter), max_queue_size=MAX_QUEUE,
            schedule_delay_millis=SCHEDULE_DELAY_MS)
        self._span_cls = _request_span_class()
        self._context_cls = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._server = SpanKind.SERVER

    def start(self, headers: dict[str, str]) -> TraceContext:
        return self.sampler.start(headers)

    def emit(self, trace: TraceContext, name: str, start_ns: int, end_ns: int,
             render: Render) -> None:
        """Queue a finished, sampled request for export: its server span, rendering the
        rest (``render`` runs in the export thread)."""
        context_cls = self._context_cls
        parent = (context_cls(trace.trace_id, trace.parent_id, True, self._sampled)
                  if trace.parent_id else None)
        self.processor.on_end(self._span_cls(
            render, name=name,
            context=context_cls(trace.trace_id, trace.span_id, False, self._sampled),
            parent=parent, resource=self.resource, kind=self._server, start_time=start_ns,
            end_time=end_ns, instrumentation_scope=self.scope))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Export what is queued and stop the export thread, waiting at most ``timeout_s``
        (a collector that does not answer is not waited for: the rest is dropped). Blocking:
        call it off the event loop."""
        flush = threading.Thread(target=self.processor.shutdown, name="narwhal-trace-flush",
                                 daemon=True)
        flush.start()
        flush.join(timeout_s)
