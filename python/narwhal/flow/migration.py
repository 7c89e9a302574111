"""Migration: a stream that broke after its headers goes on on another engine.

The relay (``relay.py``) decides when; this module holds what outlives one request: the
per-process limit and counts (``narwhal_migrations_total{reason}``, this process's view like
the engines' attempt counters), and the opening of a continuation attempt, which unlike
``attempt.dispatch`` never answers the client itself (the answer is already under way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from narwhal.fleet.engine import Engine
from narwhal.flow.attempt import Retry
from narwhal.upstream.client import UpstreamError, UpstreamResponse

REASONS = ("reset", "closed", "engine_error_event", "stalled")
"""Why a stream broke: connection reset, closed without ``[DONE]``, the engine's error
event, no token within ``engines[].token_timeout_s``."""
CONTINUE_PATH = "/v1/completions"


class Migrations:
    """Per process: how many migrations were made, by why the stream broke."""

    __slots__ = ("counts", "failed")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(REASONS, 0)  # continuations dispatched, by reason
        self.failed = dict.fromkeys(REASONS, 0)  # of which the continuation did not open

    def metric_families(self) -> list[Metric]:
        made = CounterMetricFamily(
            "narwhal_migrations", "Broken streams continued on another engine, by why the "
            "stream broke (this process's view).", labels=["reason"])
        failed = CounterMetricFamily(
            "narwhal_migrations_failed", "Migrations whose continuation engine did not open "
            "its stream (the request then ended as a mid-stream failure).", labels=["reason"])
        for reason in REASONS:
            made.add_metric([reason], self.counts[reason])
            failed.add_metric([reason], self.failed[reason])
        return [made, failed]


async def open_continuation(engine: Engine, body: bytes,
                            headers: Sequence[tuple[bytes, bytes]], *,
                            by: float) -> UpstreamResponse:
    """Open the continuation on ``engine``: its 200 response, or ``Retry`` (with the failure
    kind its outlier detection counts; ``ok`` for the engine's own 4xx, which says nothing
    bad of the engine) when it does not open by ``by`` or the engine's header timeout."""
    loop = asyncio.get_running_loop()
    left = by - loop.time()
    if left <= 0:
        raise Retry("neutral", "the request deadline passed")
    try:
        upstream = await engine.client.open("POST", CONTINUE_PATH, body, headers,
                                            timeout_s=min(left, engine.config.header_timeout_s))
    except UpstreamError as exc:
        kind = {"timeout": "header_timeout", "reset": "reset"}.get(exc.kind, "connect")
        raise Retry(kind, f"engine {engine.name}: {exc}") from None
    status = upstream.status
    if status == 200:
        return upstream
    upstream.abort()
    raise Retry("status_5xx" if status >= 500 else "ok",
                f"engine {engine.name} answered the continuation with {status}")
