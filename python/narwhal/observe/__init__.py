"""What an operator sees of each request besides the metrics: the access log, OpenTelemetry
traces joined to the engines' (W3C Trace Context), and the router's own log format."""

from __future__ import annotations

import asyncio

from narwhal import __version__
from narwhal.config import Config
from narwhal.observe.access_log import AccessLog
from narwhal.observe.observation import Observation, Observer
from narwhal.observe.tracing import Tracer, TracingUnavailable, check_tracing

__all__ = [
    "Observation",
    "Observer",
    "TracingUnavailable",
    "check_tracing",
    "make_observer",
]


def make_observer(config: Config) -> Observer | None:
    """This worker's observer (made on its running event loop); None when the access log and
    tracing are both off (then the flow's hooks cost one ``is not None`` check each)."""
    logging, tracing = config.logging, config.tracing
    if not logging.access_log and tracing.otlp_endpoint is None:
        return None
    access_log = (AccessLog(asyncio.get_running_loop(), logging.format, logging.access_log_file)
                  if logging.access_log else None)
    tracer = Tracer(tracing, version=__version__) if tracing.otlp_endpoint is not None else None
    return Observer(access_log, tracer)
