"""OpenTelemetry tracing (the extra ``narwhal[otel]``): the sampler, the resource the
OpenTelemetry SDK detects (``service.name``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_SERVICE_NAME``, the SDK's own attributes), and the export thread (``observe.otlp``).

The SDK is imported only when a ``Tracer`` is made, so Narwhal runs without the extra while
``tracing`` is off.
"""

from __future__ import annotations

import os

from narwhal._narwhal_fast import SpanEncoder
from narwhal.config import Tracing
from narwhal.observe.otlp import OtlpHttpExporter
from narwhal.observe.tracecontext import Sampler, TraceContext

EXTRA_HINT = "install the extra: pip install 'narwhal[otel]'"
CLOSE_TIMEOUT_S = 5.0


class TracingUnavailable(RuntimeError):
    """``tracing`` is configured but the OpenTelemetry SDK (``narwhal[otel]``) is missing."""


def check_tracing(config: Tracing) -> None:
    """At start-up, before any worker: raise TracingUnavailable naming the extra when
    ``tracing.otlp_endpoint`` is set and the SDK cannot be imported."""
    if config.otlp_endpoint is None:
        return
    try:
        import opentelemetry.sdk.resources  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing.otlp_endpoint is set but the OpenTelemetry SDK is not installed; "
            + EXTRA_HINT
        ) from exc


class Tracer:
    """One worker process's tracing: which requests are sampled, how their spans are
    encoded, and the thread that exports them."""

    def __init__(self, config: Tracing, *, version: str) -> None:
        check_tracing(config)
        from opentelemetry.sdk.resources import Resource

        assert config.otlp_endpoint is not None
        self.sampler = Sampler(config.sample_ratio)
        resource = Resource.create({"service.name": config.service_name,
                                    "service.version": version})
        # span IDs of the internal spans: a counter from a random start, mixed (unique and
        # random-looking, as W3C asks; one draw of the OS's randomness per worker)
        self.encoder = SpanEncoder(list(resource.attributes.items()), "narwhal", version,
                                   seed=int.from_bytes(os.urandom(8), "little"))
        self.exporter = OtlpHttpExporter(config.otlp_endpoint, self.encoder)
        self.submit = self.exporter.submit
        """Queue a finished request's encoded spans for export (no waiting)."""

    def start(self, headers: dict[str, str]) -> TraceContext:
        return self.sampler.start(headers)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Export what is queued and stop the export thread, waiting at most ``timeout_s``
        (a collector that does not answer is not waited for: the rest is dropped). Blocking:
        call it off the event loop."""
        self.exporter.close(timeout_s)
