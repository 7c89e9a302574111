"""One completion request as the access log and its trace see it.

The flow calls a few hooks through one ``Observation`` per request (arrival, parsed, sized,
placed, each engine attempt's beginning and verdict, the first token, the output, the end);
each hook only records a moment or a number. At the end the observation is written out
once: an access-log line, and, when the request's trace is sampled, its spans, which the
Rust encoder (``SpanEncoder.encode``) writes from its ``span_record()`` (the oracle,
``tests/reference/otlp_oracle.py``, reads this object; the unit tests compare the two). With
both the access log and tracing off there is no ``Observer`` and no observation: each hook in
the flow is one ``is not None`` check.

Moments are ``time.monotonic_ns()``; a span's wall-clock time is its moment plus the
request's offset between the two clocks, taken once at arrival.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from narwhal.config import EngineConfig
from narwhal.observe.access_log import AccessLog
from narwhal.observe.tracecontext import TraceContext, new_span_id
from narwhal.observe.tracing import Tracer
from narwhal.request.parse import Parsed
from narwhal.server.exchange import Request

Headers = Sequence[tuple[bytes, bytes]]

OPERATIONS = {"chat": "chat", "completion": "text_completion"}
"""Route to ``gen_ai.operation.name`` (the OpenTelemetry GenAI semantic conventions)."""
MAX_LOGGED_CHARS = 256
"""Client-chosen values (request id, model) are cut to this many characters in the log."""
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_LOW_64 = (1 << 64) - 1

SpanRecord = tuple[
    tuple[int, int, int, int, bool],  # trace ID high and low bits, parent, server span, sampled
    tuple[int, int, int, int, int, int, int],  # offset, start, end, parsed, sized, placed, TTFT
    tuple[str | None, str, str, str, str | None, str],  # model, route, path, class, reason, id
    tuple[int, int | None, int, float | None],  # status, prompt, output tokens, queue wait
    Sequence[str],  # placed engines
    list[tuple[str, str, str, int, int, int, int, str]],  # attempts
]
"""A finished request as ``SpanEncoder.encode`` reads it (``Observation.span_record``)."""


class Observer:
    """Per worker process: where finished observations go."""

    def __init__(self, access_log: AccessLog | None, tracer: Tracer | None) -> None:
        self.access_log = access_log
        self.tracer = tracer
        # bound once: tracing's per-request cost is mostly Python calls (an observation has a
        # trace only when there is a tracer)
        self.sampler = tracer.sampler if tracer is not None else None
        self.encode_spans: Callable[[SpanRecord], bytes] = (
            tracer.encoder.encode if tracer is not None else _no_tracer)
        self.submit_spans: Callable[[bytes], None] = (
            tracer.submit if tracer is not None else _no_tracer)

    def begin(self, request: Request, request_id: str) -> Observation:
        """A completion request's headers are in; ``request_id`` is the ``X-Request-Id``
        every engine attempt carries."""
        sampler = self.sampler
        trace = sampler.start(request.headers) if sampler is not None else None
        return Observation(self, request, request_id, trace)

    async def close(self) -> None:
        """Write out the access log's buffer; export the queued spans (in a thread, bounded)
        and stop the export thread."""
        if self.access_log is not None:
            self.access_log.close()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.close)


def _no_tracer(_: object) -> Any:
    raise AssertionError("an observation without a tracer has no trace to write out")


class _Attempt:
    __slots__ = ("end", "engine", "host", "outcome", "port", "span_id", "start")

    def __init__(self, engine: EngineConfig, span_id: int, start: int) -> None:
        self.engine = engine
        self.span_id = span_id
        self.start = start
        self.end = 0
        self.outcome = ""
        self.host, self.port = _address(engine.url) if span_id else ("", 0)


@functools.lru_cache(maxsize=1024)
def _address(url: str) -> tuple[str, int]:
    """An engine URL's host and port, as its attempt spans name them (``EngineConfig.host``
    and ``.port`` parse the URL on every call)."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or 0


class Observation:
    """The moments and figures of one request's journey, written out once at its end."""

    __slots__ = (
        "_observer",
        "attempts",
        "cls",
        "decode_s",
        "end",
        "finished",
        "first_token_at",
        "migrations",
        "model",
        "offset",
        "output_tokens",
        "parsed_at",
        "path",
        "peer",
        "placed_at",
        "placed_engines",
        "prompt_tokens",
        "queue_wait_s",
        "reason",
        "request_id",
        "route",
        "sized_at",
        "start",
        "status",
        "stream",
        "trace",
    )

    def __init__(self, observer: Observer, request: Request, request_id: str,
                 trace: TraceContext | None) -> None:
        self._observer = observer
        self.start = time.monotonic_ns()
        self.offset = time.time_ns() - self.start
        self.request_id = request_id
        self.path = request.path
        self.peer = request.peer
        self.trace = trace
        self.route = ""
        self.model: str | None = None
        self.stream: bool | None = None
        self.parsed_at = self.sized_at = self.placed_at = self.first_token_at = 0
        self.prompt_tokens: int | None = None
        self.output_tokens = 0
        self.decode_s = 0.0
        self.queue_wait_s: float | None = None
        self.placed_engines: tuple[str, ...] = ()
        self.attempts: list[_Attempt] = []
        self.finished = False
        self.migrations: tuple[str, ...] = ()  # why each migration's stream broke, in order
        self.cls = ""
        self.reason: str | None = None
        self.status = self.end = 0

    # -- hooks -------------------------------------------------------------------------------
    def parsed(self, parsed: Parsed) -> None:
        self.parsed_at = time.monotonic_ns()
        self.route = parsed.route
        self.model = parsed.model[:MAX_LOGGED_CHARS]
        self.stream = parsed.stream

    def sized(self, prompt_tokens: int) -> None:
        self.sized_at = time.monotonic_ns()
        self.prompt_tokens = prompt_tokens

    def placed(self, waited_s: float, engine: str, decode_engine: str | None) -> None:
        self.placed_at = time.monotonic_ns()
        self.queue_wait_s = waited_s
        self.placed_engines = (engine,) if decode_engine is None else (engine, decode_engine)

    def attempt_begin(self, engine: EngineConfig, headers: Headers) -> Headers:
        """An engine attempt opens: the headers it sends, carrying its span's context in
        ``traceparent`` while tracing (otherwise ``headers`` unchanged)."""
        trace = self.trace
        if trace is None:
            self.attempts.append(_Attempt(engine, 0, time.monotonic_ns()))
            return headers
        span_id = new_span_id()
        self.attempts.append(_Attempt(engine, span_id, time.monotonic_ns()))
        out = [h for h in headers if h[0] not in _TRACE_HEADERS]
        out.append((b"traceparent", trace.traceparent(span_id)))
        if trace.state:
            out.append((b"tracestate", trace.state.encode("latin-1")))
        return out

    def attempt_end(self, outcome: str) -> None:
        """The current attempt's verdict on its engine (``ok``, a failure kind, ``neutral``)."""
        if self.attempts:
            attempt = self.attempts[-1]
            if not attempt.end:
                attempt.end = time.monotonic_ns()
                attempt.outcome = outcome

    def migrated(self, reason: str) -> None:
        """The answer goes on on another engine (the next attempt) after its stream broke."""
        self.migrations += (reason,)

    def first_token(self) -> None:
        if not self.first_token_at:
            self.first_token_at = time.monotonic_ns()

    def output(self, tokens: int, decode_s: float) -> None:
        self.output_tokens = tokens
        self.decode_s = decode_s

    def finish(self, cls: str, reason: str | None, status: int) -> None:
        """The request's one counted outcome: write it out."""
        if self.finished:
            return
        self.finished = True
        self.cls, self.reason, self.status = cls, reason, status
        self.end = end = time.monotonic_ns()
        observer = self._observer
        if observer.access_log is not None:
            observer.access_log.write(self._record(cls, reason, status, end))
        trace = self.trace
        if trace is not None and trace.sampled:
            observer.submit_spans(observer.encode_spans(self.span_record()))
        # The flow's per-request objects (this one among them) can outlive the request in a
        # reference cycle until the garbage collector runs; let go of what is written out so
        # reference counting frees it now (fewer objects for each collection to walk).
        self.attempts.clear()
        self.trace = None

    def span_record(self) -> SpanRecord:
        """What the Rust encoder (``SpanEncoder.encode``) writes this request's spans from, in
        the order it reads: a tuple, which it reads faster than this object's attributes."""
        trace = self.trace
        assert trace is not None
        trace_id = trace.trace_id
        return (
            (trace_id >> 64, trace_id & _LOW_64, trace.parent_id, trace.span_id, trace.sampled),
            (self.offset, self.start, self.end, self.parsed_at, self.sized_at, self.placed_at,
             self.first_token_at),
            (self.model, self.route, self.path, self.cls, self.reason, self.request_id),
            (self.status, self.prompt_tokens, self.output_tokens, self.queue_wait_s),
            self.placed_engines,
            [(a.engine.name, a.engine.role, a.host, a.port, a.span_id, a.start, a.end,
              a.outcome) for a in self.attempts],
        )

    # -- figures -----------------------------------------------------------------------------
    def _seconds(self, since: int, until: int) -> float | None:
        return (until - since) / 1e9 if since and until else None

    def ttft_s(self) -> float | None:
        return self._seconds(self.start, self.first_token_at)

    def tpot_s(self) -> float | None:
        tokens = self.output_tokens
        return self.decode_s / (tokens - 1) if tokens > 1 and self.decode_s > 0 else None

    def engines(self) -> list[str]:
        """Every engine an attempt went to, in order (one entry per attempt)."""
        return [a.engine.name for a in self.attempts] or list(self.placed_engines)

    def client(self) -> str | None:
        peer = self.peer
        if not peer:
            return None
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def _record(self, cls: str, reason: str | None, status: int,
                end: int) -> dict[str, object]:
        log = self._observer.access_log
        assert log is not None
        record: dict[str, object] = {
            "time": log.clock.format(end + self.offset),
            "request_id": self.request_id[:MAX_LOGGED_CHARS],
            "client": self.client(),
            "route": self.path,
            "model": self.model,
            "stream": self.stream,
            "status": status or None,
            "outcome": cls,
            "reason": reason,
            "engines": self.engines(),
            "attempts": len(self.attempts),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "queue_wait_s": self.queue_wait_s,
            "ttft_s": self.ttft_s(),
            "tpot_s": self.tpot_s(),
            "total_s": (end - self.start) / 1e9,
        }
        if self.migrations:
            record["migrations"] = list(self.migrations)
        if self.trace is not None:
            record["trace_id"] = f"{self.trace.trace_id:032x}"
        return record
