"""The response side of one engine exchange, and the pause state of its connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from narwhal.http1 import WriteGate

DataSink = Callable[[bytes], None]
EndSink = Callable[[BaseException | None], None]
RawSink = Callable[[bytes], int]
"""Takes a raw read of a chunked body; returns flags (0: nothing to do)."""
EventSink = Callable[[int], None]

BODY_ENDED = 1
"""Raw-sink flag: the body's last chunk arrived (the connection may be reused)."""
BODY_MALFORMED = 2
"""Raw-sink flag: the chunked framing is malformed (with BODY_ENDED: bytes after the end)."""


class UpstreamError(Exception):
    """An engine exchange failed: ``kind`` is "connect", "reset", "timeout" or "protocol"."""

    def __init__(self, kind: str, message: str = "", *, before_headers: bool = True) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message
        self.before_headers = before_headers



def call_end(loop: asyncio.AbstractEventLoop, on_end: EndSink, exc: BaseException | None) -> None:
    """Call a sink's ``on_end`` from a protocol callback; a failing sink is reported, not raised."""
    try:
        on_end(exc)
    except Exception as err:
        loop.call_exception_handler({"message": "upstream on_end sink failed", "exception": err})


class FlowControl(WriteGate):
    """Pause state of one engine connection: reading (relay backpressure) and writing (transport).

    ``pause_reading``/``resume_reading`` map to the transport, idempotently; the write side
    (the transport's ``pause_writing``/``resume_writing``, :meth:`drain`) is the shared gate.
    """

    __slots__ = ("_transport", "read_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self.read_paused = False

    def pause_reading(self) -> None:
        if not self.read_paused and not self._transport.is_closing():
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            if not self._transport.is_closing():
                self._transport.resume_reading()


class BodySource(Protocol):
    """The connection a response's body comes from (``connection.EngineConnection``)."""

    loop: asyncio.AbstractEventLoop

    def set_body_sink(self, on_data: DataSink) -> None: ...

    def set_raw_sink(self, pump: RawSink, on_event: EventSink) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def abort(self) -> None: ...


class UpstreamResponse:
    """The response side of one engine exchange: status, headers and the body's destination."""

    __slots__ = ("_aborted", "_conn", "_done", "_end_exc", "_on_end", "_reader",
                 "_sunk", "headers", "pending", "status")

    def __init__(self, conn: BodySource, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers                      # lower-cased names
        self._conn: BodySource | None = conn     # None once the exchange is over
        self.pending: list[bytes] = []              # body that arrived before set_sink
        self._sunk = False
        self._on_end: EndSink | None = None
        self._done = False
        self._aborted = False
        self._end_exc: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None

    def set_sink(self, on_data: DataSink, on_end: EndSink) -> None:
        """Route the body to ``on_data`` (one call per network read), then ``on_end``.

        Body bytes already received are delivered before this returns, and so is ``on_end``
        when the message (or the connection) has already ended. After :meth:`abort`, the
        sink is never called.
        """
        if self._sunk:
            raise RuntimeError("the response body already has a sink")
        self._sunk = True
        buffered = self.pending
        if buffered and not self._aborted:
            on_data(buffered[0] if len(buffered) == 1 else b"".join(buffered))
        buffered.clear()
        conn = self._conn
        if conn is None:
            if not self._aborted:
                on_end(self._end_exc)
            return
        self._on_end = on_end
        conn.set_body_sink(on_data)

    async def read_all(self, limit: int = 16 << 20, *, timeout_s: float | None = None) -> bytes:
        """The whole body (at most ``limit`` bytes, else UpstreamError("protocol"); within
        ``timeout_s``, else UpstreamError("timeout") and the connection is dropped)."""
        loop = asyncio.get_running_loop()
        reader: asyncio.Future[None] = loop.create_future()
        parts: list[bytes] = []
        size = 0

        def on_data(data: bytes) -> None:
            nonlocal size
            size += len(data)
            if size > limit:
                if not reader.done():
                    reader.set_exception(UpstreamError(
                        "protocol", f"body over {limit} bytes", before_headers=False))
                self.abort()
            else:
                parts.append(data)

        def on_end(exc: BaseException | None) -> None:
            if not reader.done():
                if exc is None:
                    reader.set_result(None)
                else:
                    reader.set_exception(exc)

        def on_timeout() -> None:
            if not reader.done():
                reader.set_exception(UpstreamError(
                    "timeout", "body not complete in time", before_headers=False))
            self.abort()

        if self._aborted:
            raise UpstreamError("reset", "aborted by the caller", before_headers=False)
        self._reader = reader
        timer = loop.call_later(timeout_s, on_timeout) if timeout_s is not None else None
        try:
            self.set_sink(on_data, on_end)
            await reader
        except asyncio.CancelledError:
            self.abort()
            raise
        finally:
            self._reader = None
            if timer is not None:
                timer.cancel()
        return b"".join(parts)

    def set_raw_sink(self, pump: RawSink, on_event: EventSink) -> bool:
        """After :meth:`set_sink`: hand the rest of a chunked body to ``pump`` raw, framing
        included (``EngineConnection.set_raw_sink``). False: not now (not chunked, not at a
        chunk boundary, over); the data sink goes on."""
        conn = self._conn
        return conn is not None and self._sunk and conn.set_raw_sink(pump, on_event)

    def pause_reading(self) -> None:
        """Stop reading from the engine (the client is slow)."""
        if self._conn is not None:
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.resume_reading()

    def abort(self) -> None:
        """Drop the connection now; the engine sees the disconnect. No sink calls follow."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        self._done = True
        self._aborted = True
        self._on_end = None
        self._end_exc = UpstreamError("reset", "aborted by the caller", before_headers=False)
        conn.abort()
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_exception(self._end_exc)

    # -- connection side ----------------------------------------------------------------

    def finish(self, exc: BaseException | None) -> None:
        """The message ended (``exc`` None) or the connection died under it."""
        if self._done:
            return
        self._done = True
        self._end_exc = exc
        conn, self._conn = self._conn, None
        on_end, self._on_end = self._on_end, None
        if on_end is not None and conn is not None:
            call_end(conn.loop, on_end, exc)
