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
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("narwhal.tracing")

_Q = struct.Struct("<Q")  # fixed64
_I = struct.Struct("<I")  # fixed32
_D = struct.Struct("<d")  # double
_YIELD_EVERY = 64
"""Spans encoded between GIL releases, so the event loop never waits long on this thread."""
_WARN_EVERY_S = 60.0


def _varint(n: int) -> bytes:
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
    """Spans to ``ExportTraceServiceRequest`` bytes, for one resource and one scope."""

    def __init__(self, resource: Mapping[str, object], scope: str, version: str) -> None:
        self._kv_cache: dict[tuple[str, object], bytes] = {}
        head = b"".join(_field(b"\x0a", self._kv(k, v)) for k, v in resource.items())
        self._resource = _field(b"\x0a", head)  # ResourceSpans.resource = 1
        self._scope = _field(b"\x0a", _field(b"\x0a", scope.encode())
                             + _field(b"\x12", version.encode()))  # ScopeSpans.scope = 1

    def _kv(self, key: str, value: object) -> bytes:
        """One ``KeyValue`` (cached: names, routes and engines repeat across spans)."""
        cache_key = (key, value) if not isinstance(value, (list, float)) else None
        if cache_key is not None:
            hit = self._kv_cache.get(cache_key)
            if hit is not None:
                return hit
        encoded = _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))
        if cache_key is not None:
            if len(self._kv_cache) >= 4096:
                self._kv_cache.clear()
            self._kv_cache[cache_key] = encoded
        return encoded

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
        return [_field(tag, self._kv(k, v)) for k, v in (attributes or {}).items()]

    def span(self, span: Any) -> bytes:
        """One ``Span`` message."""
        ctx = span.context
        parent = span.parent
        name = span.name.encode()
        parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"),
                 b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
        state = ctx.trace_state
        if state:
            parts.append(_field(b"\x1a", state.to_header().encode()))
        if parent is not None:
            parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        parts += (b"\x2a", _varint(len(name)), name,
                  b"\x30", _varint(span.kind.value + 1),  # the SDK's kinds start at INTERNAL=0
                  b"\x39", _Q.pack(span.start_time or 0),
                  b"\x41", _Q.pack(span.end_time or 0))
        parts += self._attributes(b"\x4a", span.attributes)
        for event in span.events:
            body = b"\x09" + _Q.pack(event.timestamp) + _field(b"\x12", event.name.encode())
            body += b"".join(self._attributes(b"\x1a", event.attributes))
            parts.append(_field(b"\x5a", body))
        status = span.status
        if status is not None and status.status_code.value:
            body = b"\x18" + _varint(status.status_code.value)
            if status.description:
                body = _field(b"\x12", status.description.encode()) + body
            parts.append(_field(b"\x7a", body))
        # flags: the W3C trace flags, and whether the parent is remote (known)
        flags = int(ctx.trace_flags) | 0x100 | (0x200 if parent is not None and parent.is_remote
                                                else 0)
        parts += (b"\x85\x01", _I.pack(flags))
        return b"".join(parts)

    def request(self, spans: Iterable[Any]) -> bytes:
        """The whole ``ExportTraceServiceRequest``."""
        encoded = []
        for i, span in enumerate(spans, 1):
            encoded.append(_field(b"\x12", self.span(span)))  # ScopeSpans.spans = 2
            if i % _YIELD_EVERY == 0:
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
