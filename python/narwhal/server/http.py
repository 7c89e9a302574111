"""HTTP/1.1 server: one asyncio Protocol per connection, parsing with httptools.

The protocol object is both the ``asyncio.Protocol`` and the httptools callback sink.
Callbacks never await: they record, start a task, or arm a timer. Each request/response
exchange is a small :class:`Responder`. Pipelined requests are answered strictly in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import Any, Protocol, cast

import httptools

from narwhal.errors import Refusal
from narwhal.http1 import merge_headers
from narwhal.server.eager import start_task
from narwhal.server.exchange import App, EarlyResponse, Request, Responder, ServerLimits
from narwhal.server.flow_control import FlowControl
from narwhal.server.responses import STATUS_LINES, error_body, refusal_response

__all__ = ["HttpProtocol", "Server"]

_MAX_PIPELINED = 32


class Server(Protocol):
    """What a connection needs from the server that accepted it
    (``server.listener.HttpServer``)."""

    app: App
    limits: ServerLimits
    loop: asyncio.AbstractEventLoop
    connections: set[HttpProtocol]
    draining: bool

    def log_exception(self, request: Request) -> None: ...


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: Server):
        # shared
        self.server = server
        self.app = server.app
        self.loop = server.loop
        self.limits = server.limits
        # per connection
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[Any, ...] | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.flow = FlowControl()
        self.pending: deque[Request] = deque()
        self.active: Responder | None = None
        self.active_task: asyncio.Task[None] | None = None
        self.feeding = False  # inside the parser (data_received)
        self.starting: tuple[Request, Responder] | None = None  # a handler to start after it
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None  # when an idle or slow connection closes
        self.closing = False
        self.reading_paused = False
        self.running_next = False
        self.failure: tuple[int, str] | None = None  # answered after the exchanges ahead of it
        # per request (being parsed)
        self.url = b""
        self.header_list: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.current: Request | None = None
        self.discarding = False

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        high = self.limits.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self.server.connections.add(self)
        self._arm(self.limits.keepalive_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        self._disarm()
        if self.timer is not None:  # nothing to time any more: let the connection go
            self.timer.cancel()
            self.timer = None
        self.flow.release()
        if self.current is not None:
            self.app.on_abandon(self.current)
            self.current = None
        while self.pending:
            self.app.on_abandon(self.pending.popleft())
        active = self.active
        if active is not None and not active.complete:
            active._lost()

    def data_received(self, data: bytes) -> None:
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request itself was complete: answer it (ignoring the upgrade), then close.
            self._stop_parsing(None)
        except httptools.HttpParserError:
            if not self.discarding:
                self._fail(400, "Malformed HTTP request")
        finally:
            self.feeding = False
        started, self.starting = self.starting, None
        if started is not None:  # after the parser saw all of this read (an upgrade, junk)
            self._start(*started)

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self.active is None and self.pending and not self.closing:
            self._next()  # a pipelined exchange waited for the client to read

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.header_list = []
        self.header_bytes = 0
        if self.active is None and not self.pending:
            self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > self.limits.max_header_bytes:
            self._fail(431, "Request line and headers are too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        self.header_list.append((name, value))
        if self.header_bytes > self.limits.max_header_bytes:
            self._fail(431, "Request headers are too large")
        elif len(self.header_list) > self.limits.max_headers:
            self._fail(431, "Too many request headers")

    def on_headers_complete(self) -> None:
        if self.closing:
            return
        if self.active is None and not self.pending:
            self._arm(self.limits.header_timeout_s)  # the body must keep coming (idle timeout)
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"#" not in url:
            path, query = url, b""  # origin form without a query: nothing to split
        else:
            parsed = httptools.parse_url(url)
            path, query = parsed.path, parsed.query or b""
        headers = merge_headers(self.header_list)
        request = Request(
            self.parser.get_method().decode("ascii", "replace"),
            path.decode("latin-1"),
            query.decode("latin-1"),
            headers,
            self.loop.time(),
        )
        request.keep_alive = self.parser.should_keep_alive()
        request.peer = self.peer
        self.current = request
        try:
            self.app.on_headers(request)
        except EarlyResponse as early:
            request.early = early
            if early.close:
                # The body will not be read: answer (in order), stop parsing, close.
                request.keep_alive = False
                self._complete_request(request)
                self.discarding = True
                self.current = None
                if self.transport is not None:
                    self.transport.pause_reading()
                return
            # Otherwise the (bounded) body is read and dropped, and the answer goes out in
            # order when the message completes, keeping the connection usable.
        if headers.get("expect", "").lower() == "100-continue" and self.active is None:
            self.transport_write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.current
        if request is None or self.discarding:
            return
        request.body_size += len(body)
        if self.deadline is not None:
            self._arm(self.limits.header_timeout_s)
        if request.body_size > self.limits.max_request_bytes and request.early is None:
            request.early = self.app.on_body_too_large(request)
            request.keep_alive = False
            request.body_parts = []
            self._complete_request(request)
            self.discarding = True
            self.current = None
            if self.transport is not None:
                self.transport.pause_reading()
            return
        if request.early is None:
            request.body_parts.append(body)

    def on_message_complete(self) -> None:
        request = self.current
        if request is None or self.discarding:
            return
        self.current = None
        parts = request.body_parts
        request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        request.body_parts = []
        self._complete_request(request)

    # -- exchanges -------------------------------------------------------------------------
    def _complete_request(self, request: Request) -> None:
        if self.active is None and not self.pending and not self.flow.write_paused:
            self._run(request)
        else:
            self.pending.append(request)
            if len(self.pending) >= _MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True

    def _run(self, request: Request) -> None:
        self._disarm()
        keep_alive = request.keep_alive and not self.closing and not self.server.draining
        responder = Responder(self, keep_alive)
        self.active = responder
        early = request.early
        if early is not None:
            responder.send(early.status, early.body, early.headers)
            return
        if self.feeding:
            self.starting = (request, responder)  # once the parser is done with this read
        else:
            self._start(request, responder)

    def _start(self, request: Request, responder: Responder) -> None:
        # The handler runs now, up to its first wait, instead of a loop turn later (see
        # eager.py). An answer may complete (and the next pipelined request start) inside.
        task = start_task(self.loop, self._handle(request, responder))
        if self.active is responder and not task.done():
            self.active_task = task

    async def _handle(self, request: Request, responder: Responder) -> None:
        try:
            await self.app.handle(request, responder)
        except Exception:  # a bug in a handler must not leave the client hanging
            self.server.log_exception(request)
            if not responder.started:
                status, headers, body = refusal_response(Refusal("internal_error"))
                responder.send(status, body, headers)
            else:
                responder.abort()
        finally:
            if not responder.complete:
                responder.abort()

    def exchange_done(self, responder: Responder) -> None:
        if responder is not self.active:
            return
        self.active = None
        self.active_task = None
        if not responder._keep_alive:
            self.close()
            return
        if self.pending:
            # A client that does not read its answers gets no more of them (bounded memory):
            # the next exchange starts when its buffer drains (resume_writing).
            if not self.flow.write_paused:
                self._next()
        elif self.discarding:  # parsing stopped: every parsed request is answered
            self._write_failure()
            self.close()
        elif not self.closing:
            self._arm(self.limits.keepalive_timeout_s)

    def _next(self) -> None:
        """Run pipelined requests in order; read again once the pipeline is short.

        A loop, not recursion: answers that complete at once (early refusals) would otherwise
        nest one call per pipelined request and overflow the stack.
        """
        if self.running_next:
            return  # the loop below, further up the stack, takes the next one
        self.running_next = True
        try:
            while self.pending and self.active is None and not self.flow.write_paused:
                self._run(self.pending.popleft())
                if self.reading_paused and len(self.pending) < _MAX_PIPELINED // 2:
                    self.reading_paused = False
                    if self.transport is not None and not self.discarding:
                        self.transport.resume_reading()
        finally:
            self.running_next = False

    # -- helpers ---------------------------------------------------------------------------
    def transport_write(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            self.transport.write(data)

    def _fail(self, status: int, message: str) -> None:
        """An HTTP-level error: answer the requests ahead of it, then this error, and close."""
        self._stop_parsing((status, message))

    def _stop_parsing(self, failure: tuple[int, str] | None) -> None:
        """Read no more: requests already parsed are answered in order, then ``failure`` (if
        any) goes out and the connection closes."""
        if self.closing or self.discarding:
            return
        if self.current is not None:
            malformed = failure is not None and failure[0] == 400
            self.app.on_abandon(self.current, malformed=malformed)
            self.current = None
        self.discarding = True
        self.failure = failure
        if self.transport is not None:
            self.transport.pause_reading()
        if self.active is None and not self.pending:
            self._write_failure()
            self.close()
        elif failure is None and not self.pending and self.active is not None:
            self.active._keep_alive = False  # its head says close, if it has not gone out

    def _write_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            status, message = failure
            code = "header_too_large" if status == 431 else "bad_request"
            body = error_body(message, "invalid_request_error", None, code)
            head = b"%bcontent-type: application/json\r\ncontent-length: %d\r\n"
            self.transport_write(
                head % (STATUS_LINES[status], len(body)) + b"connection: close\r\n\r\n" + body
            )

    def _arm(self, delay: float) -> None:
        """Close the connection ``delay`` seconds from now unless re-armed or disarmed. One
        timer serves every deadline: a later deadline keeps the timer already set (it looks
        again when it fires), so a request does not cancel and schedule timers 4 times."""
        when = self.loop.time() + delay
        self.deadline = when
        timer = self.timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self.timer = self.loop.call_at(when, self._timeout)

    def _disarm(self) -> None:
        self.deadline = None  # a timer still set finds nothing to do

    def _timeout(self) -> None:
        self.timer = None
        deadline = self.deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._timeout)
            return
        self.deadline = None
        if self.active is None and not self.pending:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closing:
            self.closing = True
            self.transport.close()

    def shutdown(self) -> None:
        """Graceful shutdown: close when idle; an active exchange finishes first."""
        if self.active is None and not self.pending:
            self.close()
