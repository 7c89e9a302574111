"""One completion request as the access log and its trace see it.

The flow calls a few hooks through one ``Observation`` per request (arrival, parsed, sized,
placed, each engine attempt's beginning and verdict, the first token, the output, the end);
each hook only records a moment or a number. At the end the observation is written out
once: an access-log line, and, when the request's trace is sampled, its spans. With both the
access log and tracing off there is no ``Observer`` and no observation: each hook in the flow
is one ``is not None`` check.

Moments are ``time.monotonic_ns()``; a span's wall-clock time is its moment plus the
request's offset between the two clocks, taken once at arrival.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from narwhal.config import EngineConfig
from narwhal.observe.access_log import AccessLog
from narwhal.observe.otlp import CLIENT, INTERNAL, SERVER, Encoder, SpanData
from narwhal.observe.tracecontext import TraceContext, new_span_id
from narwhal.observe.tracing import Tracer
from narwhal.request.parse import Parsed
from narwhal.server.exchange import Request

Headers = Sequence[tuple[bytes, bytes]]

OPERATIONS = {"chat": "chat", "completion": "text_completion"}
"""Route to ``gen_ai.operation.name`` (the OpenTelemetry GenAI semantic conventions)."""
MAX_LOGGED_CHARS = 256
"""Client-chosen values (request id, model) are cut to this many characters in the log."""
_ERROR_CLASSES = frozenset({"failed", "expired"})
_NOT_A_FAILURE = frozenset({"ok", "neutral"})
_TRACE_HEADERS = (b"traceparent", b"tracestate")


class Observer:
    """Per worker process: where finished observations go."""

    def __init__(self, access_log: AccessLog | None, tracer: Tracer | None) -> None:
        self.access_log = access_log
        self.tracer = tracer

    def begin(self, request: Request, request_id: str) -> Observation:
        """A completion request's headers are in; ``request_id`` is the ``X-Request-Id``
        every engine attempt carries."""
        tracer = self.tracer
        trace = tracer.start(request.headers) if tracer is not None else None
        return Observation(self, request, request_id, trace)

    async def close(self) -> None:
        """Write out the access log's buffer; export the queued spans (in a thread, bounded)
        and stop the export thread."""
        if self.access_log is not None:
            self.access_log.close()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.close)


class _Attempt:
    __slots__ = ("end", "engine", "outcome", "span_id", "start")

    def __init__(self, engine: EngineConfig, span_id: int, start: int) -> None:
        self.engine = engine
        self.span_id = span_id
        self.start = start
        self.end = 0
        self.outcome = ""


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
        self.migrations: list[str] = []  # why each migration's stream broke, in order
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
        span_id = new_span_id() if trace is not None else 0
        self.attempts.append(_Attempt(engine, span_id, time.monotonic_ns()))
        if trace is None:
            return headers
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
        self.migrations.append(reason)

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
        tracer = observer.tracer
        if tracer is not None and self.trace is not None and self.trace.sampled:
            tracer.submit(self.encode(tracer.encoder))

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

    # -- spans: encoded once the request has finished -------------------------------------
    def _name(self) -> str:
        model = self.model
        if model is None:
            return f"POST {self.path}"
        return f"{OPERATIONS.get(self.route, '')} {model}"

    def spans(self, encoder: Encoder) -> list[SpanData]:
        """The server span and its children: sizing, admission wait, placement, attempts
        (constant attributes pre-encoded by ``encoder``)."""
        trace = self.trace
        assert trace is not None and self.finished
        off, end, root = self.offset, self.end, trace.span_id
        name = self._name()
        operation = OPERATIONS.get(self.route, "")
        gen_ai: list[tuple[str, object]] = []
        if self.model is not None:
            gen_ai = [("gen_ai.operation.name", operation), ("gen_ai.request.model", self.model)]
        spans: list[SpanData] = []
        if self.parsed_at:
            spans.append(SpanData(
                "narwhal.sizing", INTERNAL, new_span_id(), root, self.parsed_at + off,
                (self.sized_at or end) + off,
                (("gen_ai.usage.input_tokens", self.prompt_tokens or 0),)))
        if self.sized_at:
            waited = () if self.queue_wait_s is None else (
                ("narwhal.queue_wait_s", self.queue_wait_s),)
            refused_here = not self.placed_at and self.cls in _ERROR_CLASSES
            spans.append(SpanData(
                "narwhal.admission_wait", INTERNAL, new_span_id(), root, self.sized_at + off,
                (self.placed_at or end) + off, waited,
                error=(self.reason or self.cls) if refused_here else None))
        attempts = self.attempts
        if self.placed_at:
            placement: list[tuple[str, object]] = [("narwhal.engine", self.placed_engines[0])]
            if len(self.placed_engines) > 1:
                placement.append(("narwhal.decode_engine", self.placed_engines[1]))
            spans.append(SpanData(
                "narwhal.placement", INTERNAL, new_span_id(), root, self.placed_at + off,
                (attempts[0].start if attempts else end) + off, placement))
        for index, attempt in enumerate(attempts, 1):
            outcome = attempt.outcome or "unjudged"
            engine = attempt.engine
            failed = outcome not in _NOT_A_FAILURE
            key = ("attempt", operation, self.model, engine.name, engine.url, engine.role)
            fixed = encoder.fixed(key, _attempt_attributes, gen_ai, engine)
            attributes: tuple[tuple[str, object], ...] = (
                ("narwhal.attempt", index), ("narwhal.attempt.outcome", outcome))
            if failed:
                attributes += (("error.type", outcome),)
            spans.append(SpanData(
                name if gen_ai else "narwhal.attempt", CLIENT, attempt.span_id, root,
                attempt.start + off, (attempt.end or end) + off, attributes,
                error=outcome if failed else None, fixed=fixed))
        error = (self.reason or self.cls) if (
            self.cls in _ERROR_CLASSES or self.status >= 500) else None
        events = (("first_token", self.first_token_at + off),) if self.first_token_at else ()
        fixed = encoder.fixed(("server", operation, self.model, self.path),
                              _server_fixed_attributes, gen_ai, self.path)
        spans.append(SpanData(
            name, SERVER, root, trace.parent_id, self.start + off, end + off,
            self._server_attributes(error), events, error,
            remote_parent=bool(trace.parent_id), fixed=fixed))
        return spans

    def encode(self, encoder: Encoder) -> bytes:
        """The request's spans, encoded for the export thread's queue."""
        trace = self.trace
        assert trace is not None
        trace_id = trace.trace_id.to_bytes(16, "big")
        sampled = 1 if trace.sampled else 0
        return b"".join(encoder.span(trace_id, sampled, span) for span in self.spans(encoder))

    def _server_attributes(self, error: str | None) -> list[tuple[str, object]]:
        """What the server span says beyond its model and route (the admission-wait span
        has the queue wait; the access log has the client, TPOT and more)."""
        attributes: list[tuple[str, object]] = [
            ("narwhal.request_id", self.request_id),
            ("narwhal.outcome", self.cls),
        ]
        if self.status:
            attributes.append(("http.response.status_code", self.status))
        if self.reason is not None:
            attributes.append(("narwhal.reason", self.reason))
        if error is not None:
            attributes.append(("error.type", error))
        if self.prompt_tokens is not None:
            attributes.append(("gen_ai.usage.input_tokens", self.prompt_tokens))
        if self.model is not None:
            attributes.append(("gen_ai.usage.output_tokens", self.output_tokens))
        if self.attempts:
            legs = len({a.engine.role for a in self.attempts})
            attributes += [("narwhal.engines", tuple(self.engines())),
                           ("narwhal.retries", len(self.attempts) - legs)]
        elif self.placed_engines:
            attributes.append(("narwhal.engines", self.placed_engines))
        if self.first_token_at:
            attributes.append(("narwhal.ttft_s", (self.first_token_at - self.start) / 1e9))
        return attributes

def _attempt_attributes(gen_ai: list[tuple[str, object]],
                        engine: EngineConfig) -> list[tuple[str, object]]:
    """An attempt span's attributes that its engine and model fix."""
    return [*gen_ai, ("server.address", engine.host), ("server.port", engine.port),
            ("narwhal.engine", engine.name), ("narwhal.engine.role", engine.role)]


def _server_fixed_attributes(gen_ai: list[tuple[str, object]],
                             path: str) -> list[tuple[str, object]]:
    """The server span's attributes that its route and model fix."""
    return [*gen_ai, ("http.request.method", "POST"), ("http.route", path)]
