"""One keep-alive HTTP/1.1 engine connection: requests, httptools parsing, raw chunked bodies."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol, cast

import httptools

from narwhal.http1 import merge_headers
from narwhal.upstream.response import (
    BODY_ENDED,
    BODY_MALFORMED,
    DataSink,
    EventSink,
    FlowControl,
    RawSink,
    UpstreamError,
    UpstreamResponse,
)


class StaleConnection(UpstreamError):
    """A pooled connection died before any response byte: safe to retry on a fresh one."""


class _UnexpectedResponse(Exception):
    """The engine sent a response nobody asked for (bytes after the end of a message)."""


class ConnectionOwner(Protocol):
    """Where a connection reports its life (``pool.EngineClient``)."""

    def connection_made(self, conn: EngineConnection) -> None: ...

    def connection_lost(self, conn: EngineConnection) -> None: ...

    def release(self, conn: EngineConnection) -> None:
        """A response ended cleanly with keep-alive: pool the connection or close it."""


class _ResponseParser(Protocol):
    """The part of ``httptools.HttpResponseParser`` used here (httptools ships no stubs)."""

    def feed_data(self, data: bytes) -> None: ...
    def get_status_code(self) -> int: ...
    def should_keep_alive(self) -> bool: ...


def _discard(data: bytes) -> None:
    """Body sink of a connection with no response attached."""


class EngineConnection(asyncio.Protocol):
    """An ``asyncio.Protocol`` that is also the httptools callback sink; callbacks never await."""

    __slots__ = (
        "_boundary",
        "_busy",
        "_chunked",
        "_client",
        "_closing",
        "_complete",
        "_flow",
        "_got_bytes",
        "_head",
        "_header_timer",
        "_keep_alive",
        "_lost",
        "_on_data",
        "_on_event",
        "_parser",
        "_pieces",
        "_pump",
        "_raw_headers",
        "_response",
        "_served",
        "_status",
        "_tail_crlf",
        "_transport",
        "_until_close",
        "_waiter",
        "idle_timer",
        "loop",
        "on_body",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, client: ConnectionOwner) -> None:
        # shared
        self.loop = loop
        self._client = client
        # per connection
        self._transport: asyncio.Transport
        self._flow: FlowControl
        self._closing = False
        self._served = 0                      # responses completed (> 0: reused from the pool)
        self._lost: asyncio.Future[None] = loop.create_future()
        self.idle_timer: asyncio.TimerHandle | None = None
        # per request
        self._busy = False                    # a request is out and its response not ended
        self._head = False
        self._got_bytes = False
        self._waiter: asyncio.Future[UpstreamResponse] | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._status = 0
        self._keep_alive = False
        self._until_close = False
        self._response: UpstreamResponse | None = None
        self._complete = False
        self._pieces: list[bytes] = []
        self._on_data: DataSink = _discard
        # raw-body mode (set_raw_sink): the rest of a chunked body goes to _pump unparsed
        self._chunked = False
        self._boundary = False                # httptools stands at a chunk boundary...
        self._tail_crlf = False               # ...if the last read also ended in CRLF
        self._pump: RawSink | None = None
        self._on_event: EventSink | None = None
        # httptools looks its callbacks up once, here: on_body is the list's own append
        self.on_body: DataSink = self._pieces.append
        self._parser: _ResponseParser = httptools.HttpResponseParser(self)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._flow = FlowControl(self._transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._client.connection_made(self)

    def data_received(self, data: bytes) -> None:
        if not self._busy:
            self.close()                      # bytes nobody asked for: never reuse this socket
            return
        pump = self._pump
        if pump is not None:                  # raw-body mode: no parser, no Python frame
            try:
                flags = pump(data)
            except Exception as exc:
                self._sink_failed(exc)
                return
            if flags:
                self._raw_event(flags)
            return
        self._got_bytes = True
        self._tail_crlf = data[-2:] == b"\r\n"
        try:
            self._parser.feed_data(data)
        except Exception as exc:              # HttpParserError, HttpParserUpgrade
            self._parse_failed(exc)
            return
        pieces = self._pieces
        if pieces:
            chunk = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            try:
                self._on_data(chunk)
            except Exception as exc:
                self._sink_failed(exc)
                return
        if self._complete:
            self._message_done(reuse=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._busy = False
        self._pump = self._on_event = None
        self._cancel_timers()
        self._flow.release()
        self._client.connection_lost(self)
        if not self._lost.done():
            self._lost.set_result(None)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            stale = self._served > 0 and not self._got_bytes
            cls = StaleConnection if stale else UpstreamError
            waiter.set_exception(cls("reset", _describe(exc, "before the response headers")))
        resp, self._response = self._response, None
        self._on_data = _discard
        if resp is not None:
            if self._until_close and exc is None:
                resp.finish(None)            # a read-until-close body ends with the connection
            else:
                resp.finish(UpstreamError(
                    "reset", _describe(exc, "in the response body"), before_headers=False))

    def pause_writing(self) -> None:
        self._flow.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()

    # -- the BodySource side: called by the response -------------------------------------

    def set_body_sink(self, on_data: DataSink) -> None:
        """Deliver the rest of the body to ``on_data`` (one call per network read)."""
        self._on_data = on_data

    def set_raw_sink(self, pump: RawSink, on_event: EventSink) -> bool:
        """From now on, hand each read of this chunked body to ``pump`` unparsed. ``pump``
        decodes the chunked framing and returns flags (BODY_ENDED, BODY_MALFORMED, bits of
        its own); non-zero flags go to ``on_event``, then the connection acts on its two.
        Only where httptools stands at a chunk boundary (False otherwise: try again after
        another read)."""
        if (not self._chunked or not self._busy or self._complete or self._closing
                or not (self._boundary and self._tail_crlf) or self._response is None):
            return False
        self._pump, self._on_event = pump, on_event
        return True

    def pause_reading(self) -> None:
        """Stop reading from the engine (the client is slow)."""
        self._flow.pause_reading()

    def resume_reading(self) -> None:
        self._flow.resume_reading()

    # -- httptools callbacks (on_body is the attribute set in __init__) -----------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_chunk_header(self) -> None:
        self._boundary = False

    def on_chunk_complete(self) -> None:
        self._boundary = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._status = status
        raw = self._raw_headers
        if status < 200:                      # 1xx: the final response follows
            raw.clear()
            return
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            raise _UnexpectedResponse
        headers = merge_headers(raw)
        raw.clear()
        head = self._head
        self._keep_alive = not head and self._parser.should_keep_alive()
        self._until_close = (not head and status not in (204, 304)
                             and "content-length" not in headers
                             and "transfer-encoding" not in headers)
        self._chunked = self._boundary = (not head
                                          and headers.get("transfer-encoding") == "chunked")
        resp = UpstreamResponse(self, status, headers)
        self._response = resp
        self._on_data = resp.pending.append
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._flow.wake()                     # open() no longer waits for the request to drain
        waiter.set_result(resp)
        if head:                              # no body follows; the parser cannot be told
            self._complete = True

    def on_message_complete(self) -> None:
        if self._status >= 200:
            self._complete = True

    # -- used by the pool and the response -----------------------------------------------

    @property
    def reusable(self) -> bool:
        return not self._closing and not self._busy and not self._transport.is_closing()

    async def request(self, data: bytes, *, head: bool, deadline: float) -> UpstreamResponse:
        """Send one serialised request; return once the final status line and headers arrive."""
        if not self.reusable:
            raise StaleConnection("reset", "pooled connection closed before reuse")
        loop = self.loop
        waiter: asyncio.Future[UpstreamResponse] = loop.create_future()
        self._waiter = waiter
        self._busy = True
        self._head = head
        self._got_bytes = False
        self._status = 0
        self._header_timer = loop.call_at(deadline, self._header_timeout)
        self._transport.write(data)
        try:
            if self._flow.write_paused:
                await self._flow.drain()      # a large body: let the transport hand it over
            return await waiter
        except asyncio.CancelledError:
            if not waiter.done() or waiter.cancelled():
                self.abort()                  # the exchange is still this request's
            elif waiter.exception() is None:
                # The response came, and may have ended and freed this connection to the
                # pool, where another request may hold it now: drop only our response.
                waiter.result().abort()
            raise

    def abort(self) -> None:
        """Close the socket now; the exchange in progress ends without further sink calls."""
        self._closing = True
        self._busy = False
        self._cancel_timers()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.cancel()                   # only its own cancelled request() is waiting
        self._response = None
        self._complete = False
        self._pieces.clear()
        self._on_data = _discard
        self._pump = self._on_event = None
        self._transport.abort()

    def close(self) -> None:
        """Close gracefully (idle timeout, pool full, Connection: close, client closing)."""
        self._closing = True
        self._cancel_timers()
        self._transport.close()

    async def wait_closed(self) -> None:
        await self._lost

    # -- internals -------------------------------------------------------------------------

    def _message_done(self, *, reuse: bool) -> None:
        resp, self._response = self._response, None
        self._complete = False
        self._busy = False
        self._on_data = _discard
        if self._pump is not None:            # httptools still thinks it is in that body
            self._parser = httptools.HttpResponseParser(self)
            self._pump = self._on_event = None
        self._chunked = False
        if (reuse and self._keep_alive and not self._closing
                and self._transport.get_write_buffer_size() == 0):
            self._served += 1
            self._flow.resume_reading()
            self._client.release(self)
        else:
            self.close()
        if resp is not None:
            resp.finish(None)

    def _raw_event(self, flags: int) -> None:
        """A raw read's flags: the sink's event first, then the body's end or bad framing."""
        on_event = self._on_event
        if on_event is not None:
            try:
                on_event(flags)
            except Exception as exc:
                self._sink_failed(exc)
                return
        if self._pump is None:                # the sink ended the exchange meanwhile
            return
        if flags & BODY_MALFORMED:
            if flags & BODY_ENDED:            # a whole body, then junk: keep the response
                self._message_done(reuse=False)
                return
            resp = self._response
            self.abort()
            if resp is not None:
                resp.finish(UpstreamError("protocol", "malformed response: bad chunked framing",
                                          before_headers=False))
        elif flags & BODY_ENDED:
            self._message_done(reuse=True)

    def _header_timeout(self) -> None:
        self._header_timer = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamError("timeout", "no response headers in time"))
        self.abort()

    def _parse_failed(self, exc: Exception) -> None:
        resp = self._response
        if self._pieces and resp is not None:
            pieces = self._pieces
            chunk = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            try:
                self._on_data(chunk)
            except Exception as err:
                self._sink_failed(err)
                return
        if self._complete:                    # a whole response, then junk: keep the response
            self._message_done(reuse=False)
            return
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        message = f"malformed response: {cause!r}"
        waiter, self._waiter = self._waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamError("protocol", message))
        if resp is not None:
            resp.finish(UpstreamError("protocol", message, before_headers=False))

    def _sink_failed(self, exc: Exception) -> None:
        resp = self._response
        self.abort()
        if resp is not None:
            resp.finish(exc)

    def _cancel_timers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None


def _describe(exc: Exception | None, where: str) -> str:
    return f"connection {'closed' if exc is None else repr(exc)} {where}"
