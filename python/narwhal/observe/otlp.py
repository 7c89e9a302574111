"""OTLP/HTTP span export: one export thread per worker process posts finished requests'
spans, encoded as OTLP protobuf, to ``<endpoint>/v1/traces``.

The event loop encodes a finished request's spans in one call to the Rust encoder
(``narwhal._narwhal_fast.SpanEncoder``, ``rust/narwhal_core/src/otlp.rs``: a few µs) and
queues the bytes (which the garbage collector does not track). The export thread wakes every
``SEND_EVERY_S`` (sooner once ``SEND_AFTER`` requests are queued), takes what is queued at
that moment, wraps it in one ``ExportTraceServiceRequest`` (Rust again) and posts it with
``http.client`` on a kept-alive connection. What the loop queues while a post is under way
waits for the next wake: so a busy router posts a few times a second, not once per handful of
requests.

Nothing here waits on the collector from the event loop: a collector that is down or slow
costs dropped spans and a warning a minute, never a request. Tests decode the output with
``opentelemetry-proto``.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from narwhal._narwhal_fast import SpanEncoder

log = logging.getLogger("narwhal.tracing")

SEND_EVERY_S = 0.5
SEND_AFTER = 2048
"""Requests queued that wake the export thread before ``SEND_EVERY_S``."""
MAX_QUEUED = 8192
"""Requests waiting for export; past it new ones are dropped (the collector is down or slow)."""
MAX_POST_BYTES = 4 << 20
SEND_BUFFER_BYTES = 4 << 20
"""The export socket's send buffer (the kernel caps it at ``net.core.wmem_max``)."""
_WARN_EVERY_S = 60.0


class OtlpHttpExporter:
    """One worker's export thread: takes encoded requests' spans from the event loop
    (:meth:`submit`, no waiting) and posts them to an OTLP/HTTP collector in batches. A failed
    post drops its batch."""

    def __init__(self, endpoint: str, encoder: SpanEncoder, *,
                 timeout_s: float = 5.0) -> None:
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
        # A list: the loop appends, the export thread copies and deletes a leading slice;
        # each is one operation under the GIL, so neither sees the other half done.
        self._queue: list[bytes] = []
        self._wake = threading.Event()
        self._stopping = False
        self._conn: http.client.HTTPConnection | None = None
        self._warned_at = float("-inf")
        self._thread = threading.Thread(target=self._run, name="narwhal-otlp-export",
                                        daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Requests whose spans wait for the export thread."""
        return len(self._queue)

    def cpu_s(self) -> float | None:
        """CPU seconds the export thread has used (None once it has stopped, or where the
        platform has no per-thread clock): its share of the router's CPU."""
        ident = self._thread.ident
        if ident is None or not self._thread.is_alive():
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (AttributeError, OSError):
            return None

    # -- the event loop's side ----------------------------------------------------------------
    def submit(self, spans: bytes) -> None:
        """Queue one request's encoded spans (``SpanEncoder.encode`` output)."""
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
            # only what is queued now: what the loop queues while this posts waits for the
            # next wake, so a busy router posts every SEND_EVERY_S or SEND_AFTER requests
            # rather than chasing the queue with a post per handful of requests
            self.send(len(self._queue))
        self.send()
        self._close()

    def send(self, limit: int | None = None) -> None:
        """Post what is queued (at most ``limit`` requests' spans; None: all), in requests of
        at most ``MAX_POST_BYTES`` (or one request's spans)."""
        queue = self._queue
        left = len(queue) if limit is None else min(limit, len(queue))
        while left > 0:
            batch = queue[:left]
            size = sum(map(len, batch))
            if size > MAX_POST_BYTES and len(batch) > 1:
                batch = batch[:max(1, len(batch) * MAX_POST_BYTES // size)]
            del queue[:len(batch)]
            left -= len(batch)
            self.export(batch)

    def export(self, batch: Sequence[bytes]) -> bool:
        try:
            status = self._post(self.encoder.request(batch))
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
            conn.connect()
            # room for a whole post in the kernel: sendall then needs one send call, not one
            # per drained window, each taking the GIL back from the event loop
            assert conn.sock is not None
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
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
