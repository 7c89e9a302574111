"""OTLP/HTTP span export: spans encoded as an OTLP protobuf ``ExportTraceServiceRequest``
and posted to ``<endpoint>/v1/traces`` by one export thread per worker process.

The encoder writes the protobuf wire format directly, for the fields Narwhal's spans use
(IDs, name, kind, times, attributes, events, status, flags); attributes that repeat (model,
route, an engine's address) are encoded once and cached. A finished request's spans are
encoded in one go (bytes, which the garbage collector does not track) and queued; the
export thread joins what is queued into one request every ``SEND_EVERY_S`` (sooner past
``SEND_AFTER`` requests) and posts it. The OpenTelemetry SDK's own span pipeline (a
``ReadableSpan`` per span, its generic encoder) measured several times the whole per-request
budget of tracing (10 % of the router's CPU), which is why Narwhal writes its own.

Nothing here waits on the collector from the event loop: a collector that is down or slow
costs dropped spans and a warning a minute, never a request. Tests decode the output with
``opentelemetry-proto``.
"""

from __future__ import annotations

import http.client
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

log = logging.getLogger("narwhal.tracing")

_Q = struct.Struct("<Q")  # fixed64
_I = struct.Struct("<I")  # fixed32
_D = struct.Struct("<d")  # double
SEND_EVERY_S = 0.5
SEND_AFTER = 256
"""Requests queued that wake the export thread before ``SEND_EVERY_S``."""
MAX_QUEUED = 8192
"""Requests waiting for export; past it new ones are dropped (the collector is down or slow)."""
MAX_POST_BYTES = 4 << 20
CACHE_ENTRIES = 4096
"""Encoded attributes kept per cache (names, routes, engines: a fleet's worth)."""
_CACHEABLE = frozenset({str, bool, tuple})
_UNIQUE = frozenset({"narwhal.request_id"})
"""Attributes whose values rarely repeat: not cached."""
_WARN_EVERY_S = 60.0
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


class OtlpHttpExporter:
    """One worker's export thread: takes encoded requests' spans from the event loop
    (:meth:`submit`, no waiting) and posts them to an OTLP/HTTP collector in batches. A failed
    post drops its batch."""

    def __init__(self, endpoint: str, encoder: Encoder, *, timeout_s: float = 5.0) -> None:
        parts = urlsplit(endpoint)
        path = parts.path.rstrip("/")
        self.url = endpoint
        self.path = path if path.endswith("/v1/traces") else path + "/v1/traces"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.timeout_s = timeout_s
        self.encoder = encoder
        self.exported = 0  # requests whose spans the collector took
        self.dropped = 0  # requests whose spans were dropped
        self._queue: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._conn: http.client.HTTPConnection | None = None
        self._warned_at = float("-inf")
        self._thread = threading.Thread(target=self._run, name="narwhal-otlp-export",
                                        daemon=True)
        self._thread.start()

    # -- the event loop's side ----------------------------------------------------------------
    def submit(self, spans: bytes) -> None:
        """Queue one request's encoded spans (``Encoder.span`` output, joined)."""
        queue = self._queue
        if len(queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        queue.append(spans)
        if len(queue) == SEND_AFTER:
            self._wake.set()

    def close(self, timeout_s: float) -> None:
        """Send what is queued and stop, waiting at most ``timeout_s`` (blocking: call it
        off the event loop)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    # -- the export thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(SEND_EVERY_S)
            self._wake.clear()
            self.send()
        self.send()
        self._close()

    def send(self) -> None:
        """Post everything queued, in requests of at most ``MAX_POST_BYTES``."""
        queue = self._queue
        while queue:
            batch: list[bytes] = []
            size = 0
            while queue and size < MAX_POST_BYTES:
                spans = queue.popleft()
                batch.append(spans)
                size += len(spans)
            self.export(batch)

    def export(self, batch: Sequence[bytes]) -> bool:
        try:
            status = self._post(self.encoder.request(b"".join(batch)))
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            return self._failed(len(batch), f"{type(exc).__name__}: {exc}")
        if not 200 <= status < 300:
            return self._failed(len(batch), f"HTTP {status}")
        self.exported += len(batch)
        return True

    def _post(self, body: bytes) -> int:
        conn = self._conn
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self._conn = cls(self.host, self.port, timeout=self.timeout_s)
        conn.request("POST", self.path, body, {"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        response.read()
        if response.will_close:
            self._close()
        return response.status

    def _failed(self, count: int, why: str) -> bool:
        self.dropped += count
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("tracing: the OTLP collector at %s did not take the spans of %d "
                        "requests (%s); spans are dropped while it is unreachable (%d so far)",
                        self.url, count, why, self.dropped)
        return False

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
