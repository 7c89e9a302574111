"""OTLP/HTTP span export: finished spans encoded as an OTLP protobuf
``ExportTraceServiceRequest`` and posted to ``<endpoint>/v1/traces``, in the export thread.

The encoder writes the protobuf wire format directly for the fields Narwhal's spans use (IDs,
name, kind, times, attributes, events, status, flags): the OpenTelemetry SDK's generic
encoder costs several times Narwhal's whole per-request tracing budget. It reads spans as
the SDK's ``ReadableSpan`` presents them (duck-typed, so this module imports without the
SDK); tests decode its output with ``opentelemetry-proto``. Nothing here runs on the event
loop, and a collector that is down or slow only costs dropped spans and a rate-limited
warning, never a request.
"""

from __future__ import annotations

import http.client
import logging
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

log = logging.getLogger("narwhal.tracing")

_Q = struct.Struct("<Q")  # fixed64
_I = struct.Struct("<I")  # fixed32
_D = struct.Struct("<d")  # double
_YIELD_EVERY = 64
"""Spans encoded between GIL releases, so the event loop never waits long on this thread."""
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
    """Spans to ``ExportTraceServiceRequest`` bytes, for one resource and one scope.

    A queued span with a ``render()`` method (``observe.tracing``'s request span) stands for
    the spans it renders: a finished request's server span and its children, built here, in
    the export thread, rather than on the event loop.
    """

    def __init__(self, resource: Mapping[str, object], scope: str, version: str) -> None:
        self._kv_cache: dict[tuple[str, object], bytes] = {}
        self._keys: dict[str, bytes] = {}
        head = b"".join(b"\x0a" + self._kv(k, v) for k, v in resource.items())
        self._resource = _field(b"\x0a", head)  # ResourceSpans.resource = 1
        self._scope = _field(b"\x0a", _field(b"\x0a", scope.encode())
                             + _field(b"\x12", version.encode()))  # ScopeSpans.scope = 1

    def _kv(self, key: str, value: object) -> bytes:
        """One ``KeyValue``, length-prefixed as a repeated field's entry needs. Keys and
        string values are cached (names, routes and engines repeat across spans)."""
        cache = self._kv_cache
        if isinstance(value, str) or value is None:
            hit = cache.get((key, value))
            if hit is not None:
                return hit
        head = self._keys.get(key)
        if head is None:
            head = self._keys[key] = _field(b"\x0a", key.encode())
        if type(value) is int and 0 <= value < 1 << 56:
            body = b"\x18" + _varint(value)  # the common case: a count
        elif type(value) is float:
            body = b"\x21" + _D.pack(value)
        else:
            body = _any_value(value)
        kv = head + b"\x12" + _varint(len(body)) + body
        encoded = _varint(len(kv)) + kv
        if isinstance(value, str):
            if len(cache) >= 4096:
                cache.clear()
            cache[(key, value)] = encoded
        return encoded

    def span(self, trace_id: bytes, sampled: int, span: SpanData) -> bytes:
        """One ``Span`` message of the trace ``trace_id`` (16 bytes)."""
        name = span.name.encode()
        parts = [b"\x0a\x10", trace_id, b"\x12\x08", span.span_id.to_bytes(8, "big")]
        if span.parent_id:
            parts += (b"\x22\x08", span.parent_id.to_bytes(8, "big"))
        parts += (b"\x2a", _varint(len(name)), name, b"\x30", _SMALL[span.kind],
                  b"\x39", _Q.pack(span.start_ns), b"\x41", _Q.pack(span.end_ns))
        kv = self._kv
        for key, value in span.attributes:
            parts += (b"\x4a", kv(key, value))
        for event_name, at in span.events:
            body = b"\x09" + _Q.pack(at) + _field(b"\x12", event_name.encode())
            parts.append(_field(b"\x5a", body))
        if span.error is not None:
            body = (_field(b"\x12", span.error.encode()) if span.error else b"") + b"\x18\x02"
            parts.append(_field(b"\x7a", body))
        # flags: the W3C trace flags, and whether the parent is remote (known)
        flags = sampled | 0x100 | (0x200 if span.remote_parent else 0)
        parts += (b"\x85\x01", _I.pack(flags))
        return b"".join(parts)

    def request(self, spans: Iterable[Any]) -> bytes:
        """The whole ``ExportTraceServiceRequest`` for a batch of queued spans."""
        encoded = []
        count = 0
        for queued in spans:
            context = queued.context
            trace_id = context.trace_id.to_bytes(16, "big")
            sampled = int(context.trace_flags) & 0xFF
            render = getattr(queued, "render", None)
            for span in render() if render is not None else (readable(queued),):
                encoded.append(_field(b"\x12", self.span(trace_id, sampled, span)))
                count += 1
                if count % _YIELD_EVERY == 0:
                    time.sleep(0)
        scope_spans = _field(b"\x12", self._scope + b"".join(encoded))
        return _field(b"\x0a", self._resource + scope_spans)


class OtlpHttpExporter:
    """Posts encoded batches to an OTLP/HTTP collector; the ``SpanExporter`` interface the
    SDK's ``BatchSpanProcessor`` calls from its own thread. A failed post drops its batch."""

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
        self.exported = 0
        self.dropped = 0
        self._conn: http.client.HTTPConnection | None = None
        self._warned_at = float("-inf")

    def export(self, spans: Sequence[Any]) -> bool:
        try:
            body = self.encoder.request(spans)
            status = self._post(body)
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            return self._failed(len(spans), f"{type(exc).__name__}: {exc}")
        if not 200 <= status < 300:
            return self._failed(len(spans), f"HTTP {status}")
        self.exported += len(spans)
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
            log.warning("tracing: the OTLP collector at %s did not take %d spans (%s); spans "
                        "are dropped while it is unreachable (%d so far)",
                        self.url, count, why, self.dropped)
        return False

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def shutdown(self) -> None:
        self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
