"""OpenTelemetry tracing (the extra ``narwhal[otel]``): finished requests' spans to the SDK's
``BatchSpanProcessor``, whose thread exports them over OTLP/HTTP (``observe.otlp``).

The SDK is imported here only when a ``Tracer`` is made, so Narwhal runs without the extra
while ``tracing`` is off. Spans are built once, when a request has finished (its hooks only
record moments), and handed to the processor's queue: nothing waits on the collector.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from narwhal.config import Tracing
from narwhal.observe.otlp import Encoder, OtlpHttpExporter
from narwhal.observe.tracecontext import Sampler, TraceContext

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.util.types import AttributeValue

EXTRA_HINT = "install the extra: pip install 'narwhal[otel]'"
SCHEDULE_DELAY_MS = 500
CLOSE_TIMEOUT_S = 5.0
MAX_QUEUE = 8192
"""Spans waiting for export; past it new spans are dropped (the collector is down or slow)."""


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


class Tracer:
    """One worker process's tracing: the sampler, span building, the export pipeline."""

    def __init__(self, config: Tracing, *, version: str) -> None:
        check_tracing(config)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        assert config.otlp_endpoint is not None
        self.sampler = Sampler(config.sample_ratio)
        self.resource = Resource.create({"service.name": config.service_name,
                                         "service.version": version})
        self.scope = InstrumentationScope("narwhal", version)
        self.exporter = OtlpHttpExporter(
            config.otlp_endpoint, Encoder(self.resource.attributes, "narwhal", version))
        self.processor: BatchSpanProcessor = BatchSpanProcessor(
            cast("SpanExporter", self.exporter), max_queue_size=MAX_QUEUE,
            schedule_delay_millis=SCHEDULE_DELAY_MS)
        self._span_cls = ReadableSpan
        self._event_cls = Event
        self._context_cls = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT,
                       "internal": SpanKind.INTERNAL}
        self._status_cls = Status
        self._error = StatusCode.ERROR
        self._unset = Status(StatusCode.UNSET)

    def start(self, headers: dict[str, str]) -> TraceContext:
        return self.sampler.start(headers)

    def span(
        self,
        trace: TraceContext,
        name: str,
        kind: str,
        span_id: int,
        parent_id: int,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue],
        *,
        events: Sequence[tuple[str, int]] = (),
        error: str | None = None,
    ) -> None:
        """Queue one finished span of a sampled trace for export. ``parent_id`` 0: a root;
        the server span's parent is the client's (remote) span."""
        remote = span_id == trace.span_id
        context_cls = self._context_cls
        parent = (context_cls(trace.trace_id, parent_id, remote, self._sampled)
                  if parent_id else None)
        span = self._span_cls(
            name,
            context_cls(trace.trace_id, span_id, False, self._sampled),
            parent=parent,
            resource=self.resource,
            attributes=attributes,
            events=tuple(self._event_cls(n, timestamp=t) for n, t in events),
            kind=self._kinds[kind],
            status=self._status_cls(self._error, error) if error is not None else self._unset,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=self.scope,
        )
        self.processor.on_end(span)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Export what is queued and stop the export thread, waiting at most ``timeout_s``
        (a collector that does not answer is not waited for: the rest is dropped). Blocking:
        call it off the event loop."""
        flush = threading.Thread(target=self.processor.shutdown, name="narwhal-trace-flush",
                                 daemon=True)
        flush.start()
        flush.join(timeout_s)
