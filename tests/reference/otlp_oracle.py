"""Pure-Python reference of the Rust span encoder (rust/narwhal_core/src/otlp.rs,
``narwhal._narwhal_fast.SpanEncoder``): readable and slow, for tests only.

``spans(observation, ids)`` is which spans a finished request has and what they say (the
server span and its children: sizing, admission wait, placement, engine attempts);
``Encoder`` writes them in the protobuf wire format of ``opentelemetry.proto.trace.v1``.
``encode(encoder, observation, ids)`` must equal ``SpanEncoder.encode(observation)`` byte for
byte when ``ids`` are the span IDs the Rust encoder drew for sizing, admission wait and
placement (tests decode them from its output). Tests decode this module's output with
``opentelemetry-proto``, which is what makes it the reference.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from narwhal.config import EngineConfig
from narwhal.observe.observation import OPERATIONS, Observation

_Q = struct.Struct("<Q")  # fixed64
_I = struct.Struct("<I")  # fixed32
_D = struct.Struct("<d")  # double
CACHE_ENTRIES = 4096
"""Encoded attributes kept per cache (names, routes, engines: a fleet's worth)."""
_CACHEABLE = frozenset({str, bool, tuple})
_UNIQUE = frozenset({"narwhal.request_id"})
"""Attributes whose values rarely repeat: not cached."""
_SMALL = [bytes((n,)) for n in range(128)]

INTERNAL, SERVER, CLIENT = 1, 2, 3
"""OTLP span kinds (the SDK's ``SpanKind`` values plus one)."""


class SpanData(NamedTuple):
    """One span as the encoder writes it (IDs as integers, times in ns since the epoch)."""

    name: str
    kind: int  # INTERNAL, SERVER or CLIENT
    span_id: int
    parent_id: int  # 0: a root span
    start_ns: int
    end_ns: int
    attributes: Sequence[tuple[str, object]]
    events: Sequence[tuple[str, int]] = ()
    error: str | None = None  # the span failed: status ERROR with this message
    remote_parent: bool = False  # the parent is another process's (the client's)
    fixed: bytes = b""  # attributes already encoded (``Encoder.fixed``), before the others


def readable(span: Any) -> SpanData:
    """An SDK ``ReadableSpan`` as SpanData."""
    parent = span.parent
    status = span.status
    error = None
    if status is not None and status.status_code.value == 2:  # StatusCode.ERROR
        error = status.description or ""
    return SpanData(span.name, span.kind.value + 1, span.context.span_id,
                    parent.span_id if parent is not None else 0, span.start_time or 0,
                    span.end_time or 0, tuple((span.attributes or {}).items()),
                    tuple((e.name, e.timestamp) for e in span.events), error,
                    parent is not None and parent.is_remote)


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: object) -> bytes:
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _D.pack(value)
    if isinstance(value, (list, tuple)):  # ArrayValue { repeated AnyValue values = 1 }
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    return _field(b"\x0a", str(value).encode())


class Encoder:
    """Spans to OTLP protobuf, for one resource and one instrumentation scope."""

    def __init__(self, resource: Mapping[str, object], scope: str, version: str) -> None:
        self._kv_cache: dict[tuple[str, object], bytes] = {}  # filled once, never cleared
        self._heads: dict[str, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._fixed: dict[Hashable, bytes] = {}
        # Resource.attributes = 1: the same KeyValue entries with tag 1 instead of 9
        head = b"".join(b"\x0a" + self._kv(k, v)[1:] for k, v in resource.items())
        self._resource = _field(b"\x0a", head)  # ResourceSpans.resource = 1
        self._scope = _field(b"\x0a", _field(b"\x0a", scope.encode())
                             + _field(b"\x12", version.encode()))  # ScopeSpans.scope = 1

    def _kv(self, key: str, value: object) -> bytes:
        """One attribute as a ``Span.attributes`` entry (tag, length, ``KeyValue``). Keys,
        and values that repeat (strings, booleans, tuples of strings) are encoded once."""
        kind = type(value)
        cacheable = kind in _CACHEABLE and key not in _UNIQUE
        if cacheable:
            hit = self._kv_cache.get((key, value))
            if hit is not None:
                return hit
        head = self._heads.get(key)
        if head is None:  # KeyValue.key = 1, then the tag of KeyValue.value = 2
            head = self._heads[key] = _field(b"\x0a", key.encode()) + b"\x12"
        if kind is int and 0 <= value < 1 << 56:  # type: ignore[operator]
            body = b"\x18" + _varint(value)  # type: ignore[arg-type]
        elif kind is float:
            body = b"\x21" + _D.pack(value)
        else:
            body = _any_value(value)
        size = len(head) + 1 + len(body)
        if size < 128 and len(body) < 128:
            encoded = b"\x4a" + _SMALL[size] + head + _SMALL[len(body)] + body
        else:
            encoded = _field(b"\x4a", head + _varint(len(body)) + body)
        if cacheable and len(self._kv_cache) < CACHE_ENTRIES:
            self._kv_cache[(key, value)] = encoded
        return encoded

    def fixed(self, key: Hashable, attributes: Callable[..., Sequence[tuple[str, object]]],
              *args: Any) -> bytes:
        """The attributes ``attributes(*args)`` gives, encoded once per ``key`` (a span's
        constant attributes: only a new key calls it)."""
        hit = self._fixed.get(key)
        if hit is None:
            hit = b"".join(self._kv(k, v) for k, v in attributes(*args))
            if len(self._fixed) < CACHE_ENTRIES:
                self._fixed[key] = hit
        return hit

    def _name(self, name: str) -> bytes:
        """``Span.name`` (tag, length, text), cached: names repeat."""
        hit = self._names.get(name)
        if hit is None:
            hit = _field(b"\x2a", name.encode())
            if len(self._names) < CACHE_ENTRIES:
                self._names[name] = hit
        return hit

    def span(self, trace_id: bytes, sampled: int, span: SpanData) -> bytes:
        """One ``Span`` of the trace ``trace_id`` (16 bytes), as a ``ScopeSpans.spans``
        field: what :meth:`request` joins."""
        parts = [b"\x0a\x10", trace_id, b"\x12\x08", span.span_id.to_bytes(8, "big")]
        if span.parent_id:
            parts += (b"\x22\x08", span.parent_id.to_bytes(8, "big"))
        parts += (self._name(span.name), b"\x30", _SMALL[span.kind],
                  b"\x39", _Q.pack(span.start_ns), b"\x41", _Q.pack(span.end_ns), span.fixed)
        kv = self._kv
        parts += [kv(key, value) for key, value in span.attributes]
        for event_name, at in span.events:
            body = b"\x09" + _Q.pack(at) + _field(b"\x12", event_name.encode())
            parts.append(_field(b"\x5a", body))
        if span.error is not None:
            body = (_field(b"\x12", span.error.encode()) if span.error else b"") + b"\x18\x02"
            parts.append(_field(b"\x7a", body))
        # flags: the W3C trace flags, and whether the parent is remote (known)
        flags = sampled | 0x100 | (0x200 if span.remote_parent else 0)
        parts += (b"\x85\x01", _I.pack(flags))
        return _field(b"\x12", b"".join(parts))

    def request(self, spans: bytes) -> bytes:
        """The ``ExportTraceServiceRequest`` around ``spans`` (joined :meth:`span` output)."""
        scope_spans = _field(b"\x12", self._scope + spans)
        return _field(b"\x0a", self._resource + scope_spans)

    def readable(self, spans: Iterable[Any]) -> bytes:
        """SDK ``ReadableSpan`` objects as :meth:`span` output."""
        return b"".join(
            self.span(s.context.trace_id.to_bytes(16, "big"), int(s.context.trace_flags) & 0xFF,
                      readable(s)) for s in spans)


_ERROR_CLASSES = frozenset({"failed", "expired"})
_NOT_A_FAILURE = frozenset({"ok", "neutral"})


def _name(obs: Observation) -> str:
    model = obs.model
    if model is None:
        return f"POST {obs.path}"
    return f"{OPERATIONS.get(obs.route, '')} {model}"


def spans(obs: Observation, encoder: Encoder, ids: Sequence[int]) -> list[SpanData]:
    """The server span and its children: sizing, admission wait, placement, attempts
    (constant attributes pre-encoded by ``encoder``)."""
    trace = obs.trace
    assert trace is not None and obs.finished
    off, end, root = obs.offset, obs.end, trace.span_id
    name = _name(obs)
    operation = OPERATIONS.get(obs.route, "")
    gen_ai: list[tuple[str, object]] = []
    if obs.model is not None:
        gen_ai = [("gen_ai.operation.name", operation), ("gen_ai.request.model", obs.model)]
    spans: list[SpanData] = []
    if obs.parsed_at:
        spans.append(SpanData(
            "narwhal.sizing", INTERNAL, ids[0], root, obs.parsed_at + off,
            (obs.sized_at or end) + off,
            (("gen_ai.usage.input_tokens", obs.prompt_tokens or 0),)))
    if obs.sized_at:
        waited = () if obs.queue_wait_s is None else (
            ("narwhal.queue_wait_s", obs.queue_wait_s),)
        refused_here = not obs.placed_at and obs.cls in _ERROR_CLASSES
        spans.append(SpanData(
            "narwhal.admission_wait", INTERNAL, ids[1], root, obs.sized_at + off,
            (obs.placed_at or end) + off, waited,
            error=(obs.reason or obs.cls) if refused_here else None))
    attempts = obs.attempts
    if obs.placed_at:
        placement: list[tuple[str, object]] = [("narwhal.engine", obs.placed_engines[0])]
        if len(obs.placed_engines) > 1:
            placement.append(("narwhal.decode_engine", obs.placed_engines[1]))
        spans.append(SpanData(
            "narwhal.placement", INTERNAL, ids[2], root, obs.placed_at + off,
            (attempts[0].start if attempts else end) + off, placement))
    for index, attempt in enumerate(attempts, 1):
        outcome = attempt.outcome or "unjudged"
        engine = attempt.engine
        failed = outcome not in _NOT_A_FAILURE
        key = ("attempt", operation, obs.model, engine.name, engine.url, engine.role)
        fixed = encoder.fixed(key, _attempt_attributes, gen_ai, engine)
        attributes: tuple[tuple[str, object], ...] = (
            ("narwhal.attempt", index), ("narwhal.attempt.outcome", outcome))
        if failed:
            attributes += (("error.type", outcome),)
        spans.append(SpanData(
            name if gen_ai else "narwhal.attempt", CLIENT, attempt.span_id, root,
            attempt.start + off, (attempt.end or end) + off, attributes,
            error=outcome if failed else None, fixed=fixed))
    error = (obs.reason or obs.cls) if (
        obs.cls in _ERROR_CLASSES or obs.status >= 500) else None
    events = (("first_token", obs.first_token_at + off),) if obs.first_token_at else ()
    fixed = encoder.fixed(("server", operation, obs.model, obs.path),
                          _server_fixed_attributes, gen_ai, obs.path)
    spans.append(SpanData(
        name, SERVER, root, trace.parent_id, obs.start + off, end + off,
        _server_attributes(obs, error), events, error,
        remote_parent=bool(trace.parent_id), fixed=fixed))
    return spans


def encode(encoder: Encoder, obs: Observation, ids: Sequence[int]) -> bytes:
    """The request's spans, encoded for the export thread's queue."""
    trace = obs.trace
    assert trace is not None
    trace_id = trace.trace_id.to_bytes(16, "big")
    sampled = 1 if trace.sampled else 0
    return b"".join(encoder.span(trace_id, sampled, span) for span in spans(obs, encoder, ids))


def _server_attributes(obs: Observation, error: str | None) -> list[tuple[str, object]]:
    """What the server span says beyond its model and route (the admission-wait span
    has the queue wait; the access log has the client, TPOT and more)."""
    attributes: list[tuple[str, object]] = [
        ("narwhal.request_id", obs.request_id),
        ("narwhal.outcome", obs.cls),
    ]
    if obs.status:
        attributes.append(("http.response.status_code", obs.status))
    if obs.reason is not None:
        attributes.append(("narwhal.reason", obs.reason))
    if error is not None:
        attributes.append(("error.type", error))
    if obs.prompt_tokens is not None:
        attributes.append(("gen_ai.usage.input_tokens", obs.prompt_tokens))
    if obs.model is not None:
        attributes.append(("gen_ai.usage.output_tokens", obs.output_tokens))
    if obs.attempts:
        legs = len({a.engine.role for a in obs.attempts})
        attributes += [("narwhal.engines", tuple(obs.engines())),
                       ("narwhal.retries", len(obs.attempts) - legs)]
    elif obs.placed_engines:
        attributes.append(("narwhal.engines", obs.placed_engines))
    if obs.first_token_at:
        attributes.append(("narwhal.ttft_s", (obs.first_token_at - obs.start) / 1e9))
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
