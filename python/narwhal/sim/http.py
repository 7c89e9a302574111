"""The simulator's own HTTP/1.1 server: an asyncio.Protocol that is also the httptools sink.

Deliberately separate from Narwhal's production server: besides keep-alive, chunked
streaming and flow control it can misbehave on purpose (reset, hang, raw bad framing).
Callbacks never await; a finished request is handed to ``App.handle`` synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol, cast

import httptools

SSE = b"text/event-stream; charset=utf-8"
JSON = b"application/json"
_STATUS = {int(s): b"HTTP/1.1 %d %s\r\n" % (int(s), s.phrase.encode()) for s in HTTPStatus}
_SERVER = b"server: uvicorn\r\n"
_MAX_PIPELINED = 8


class _Date:
    """The ``date`` header, formatted at most once per second."""

    second = -1
    header = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.header = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return cls.header


class WriteBatch:
    """While held, connection writes are kept and each connection's bytes go out in one
    transport write on release: several events per syscall, the same bytes on the wire."""

    __slots__ = ("dirty", "holding")

    def __init__(self) -> None:
        self.holding = False
        self.dirty: list[Connection] = []

    def hold(self) -> None:
        self.holding = True

    def release(self) -> None:
        self.holding = False
        dirty, self.dirty = self.dirty, []
        for conn in dirty:
            conn.flush()


class Request:
    """One parsed HTTP request."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str],
                 body: bytes, keep_alive: bool) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


class Listener(Protocol):
    """Who follows an exchange's connection: flow control and disconnects."""

    def on_pause(self) -> None: ...
    def on_resume(self) -> None: ...
    def on_close(self) -> None: ...


class App(Protocol):
    def handle(self, request: Request, exchange: Exchange) -> None: ...


class Exchange:
    """The response side of one request."""

    __slots__ = ("_conn", "closed", "finished", "keep_alive", "listener", "paused", "started")

    def __init__(self, conn: Connection, keep_alive: bool) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        self.started = False  # headers written
        self.finished = False  # response complete (or abandoned on purpose)
        self.closed = False  # the client connection is gone
        self.paused = conn.write_paused
        self.listener: Listener | None = None

    def _head(self, status: int, content_type: bytes | None,
              headers: Sequence[tuple[bytes, bytes]], length: int | None) -> bytes:
        parts = [_STATUS.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status, _Date.get(), _SERVER]
        if length is not None:
            parts.append(b"content-length: %d\r\n" % length)
        if content_type is not None:
            parts.append(b"content-type: " + content_type + b"\r\n")
        parts.extend(name + b": " + value + b"\r\n" for name, value in headers)
        parts.append(b"vary: Origin\r\n")
        if length is None:
            parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def send(self, status: int, body: bytes, content_type: bytes | None = JSON,
             headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """A complete response with Content-Length."""
        if self.started or self.closed:
            return
        self.started = True
        self._conn.write(self._head(status, content_type, headers, len(body)) + body)
        self._complete()

    def start(self, status: int = 200, content_type: bytes = SSE,
              headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """Write the headers of a chunked response."""
        if self.started or self.closed:
            return
        self.started = True
        self._conn.write(self._head(status, content_type, headers, None))

    def write_events(self, events: Sequence[bytes]) -> None:
        """Each event becomes one HTTP chunk; all go out in one transport write."""
        if self.closed:
            return
        if len(events) == 1:
            event = events[0]
            self._conn.write(b"%x\r\n%b\r\n" % (len(event), event))
        elif events:
            self._conn.write(b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events))

    def write_raw(self, data: bytes) -> None:
        """Bytes outside the chunked framing (to break it on purpose)."""
        if not self.closed:
            self._conn.write(data)

    def end(self, events: Sequence[bytes] = ()) -> None:
        """Last events, then the terminating chunk."""
        if self.closed or self.finished:
            return
        body = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events)
        self._conn.write(body + b"0\r\n\r\n")
        self._complete()

    def reset(self) -> None:
        """Drop the connection with a TCP RST."""
        self.finished = True
        self._conn.reset()

    def close(self) -> None:
        """Close the connection (FIN) without completing the response."""
        self.finished = True
        self._conn.close()

    def hang(self) -> None:
        """Never answer: the connection stays open, unusable, until the client leaves."""
        self.finished = True
        self.keep_alive = False

    def _complete(self) -> None:
        self.finished = True
        self._conn.exchange_done(self)


class Connection(asyncio.Protocol):
    """One client connection: parser sink, keep-alive, pipelining queue and flow control."""

    def __init__(self, app: App, loop: asyncio.AbstractEventLoop, keepalive_s: float,
                 registry: set[Connection], batch: WriteBatch | None = None) -> None:
        # shared
        self._app = app
        self._loop = loop
        self._keepalive_s = keepalive_s
        self._registry = registry
        self._batch = batch if batch is not None else WriteBatch()
        # per connection
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._current: Exchange | None = None
        self._queue: deque[Request] = deque()
        self._idle: asyncio.TimerHandle | None = None
        self._reading = True
        self._out: list[bytes] = []  # held by the write batch
        self.write_paused = False
        # per request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._registry.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b"Unsupported upgrade request.")
        except httptools.HttpParserError:
            self._fail(400, b"Invalid HTTP request received.")

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._queue.clear()
        ex, self._current = self._current, None
        self._transport = None
        if ex is not None:
            ex.closed = True
            if ex.listener is not None:
                ex.listener.on_close()

    def pause_writing(self) -> None:
        self.write_paused = True
        ex = self._current
        if ex is not None:
            ex.paused = True
            if ex.listener is not None:
                ex.listener.on_pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        ex = self._current
        if ex is not None:
            ex.paused = False
            if ex.listener is not None:
                ex.listener.on_resume()

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else old + ", " + text

    def on_headers_complete(self) -> None:
        if self._headers.get("expect", "").lower() == "100-continue" and self._current is None:
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self._url.decode("latin-1").partition("?")
        method = self._parser.get_method().decode("latin-1")
        request = Request(method, path, query, self._headers, b"".join(self._body),
                          bool(self._parser.should_keep_alive()))
        if self._current is None:
            self._dispatch(request)
        else:
            self._queue.append(request)
            if len(self._queue) >= _MAX_PIPELINED and self._transport is not None:
                self._transport.pause_reading()
                self._reading = False

    # -- internals
    def write(self, data: bytes) -> None:
        if self._batch.holding:
            if not self._out:
                self._batch.dirty.append(self)
            self._out.append(data)
        elif self._transport is not None:
            self._transport.write(data)

    def flush(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def reset(self) -> None:
        self.flush()
        transport = self._transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    def close(self) -> None:
        self.flush()
        if self._transport is not None:
            self._transport.close()

    def _dispatch(self, request: Request) -> None:
        ex = Exchange(self, request.keep_alive)
        self._current = ex
        try:
            self._app.handle(request, ex)
        except Exception as exc:  # a bug in the simulator must not kill the server
            print(f"narwhal-sim: error handling {request.method} {request.path}: {exc!r}",
                  file=sys.stderr, flush=True)
            if not ex.started:
                ex.keep_alive = False
                ex.send(500, b'{"error":{"message":"simulator bug","type":"InternalServerError"'
                        b',"param":null,"code":500}}')
            elif not ex.finished:
                ex.reset()

    def exchange_done(self, ex: Exchange) -> None:
        if ex is not self._current:
            return
        self._current = None
        if not ex.keep_alive:
            self.close()
            return
        if self._queue:
            if not self._reading and self._transport is not None:
                self._transport.resume_reading()
                self._reading = True
            # Run the next pipelined request outside this call chain.
            self._loop.call_soon(self._next)
        else:
            self._arm_idle()

    def _next(self) -> None:
        if self._current is None and self._queue and self._transport is not None:
            self._dispatch(self._queue.popleft())

    def _arm_idle(self) -> None:
        if self._keepalive_s > 0 and self._transport is not None:
            self._idle = self._loop.call_later(self._keepalive_s, self.close)

    def _fail(self, status: int, message: bytes) -> None:
        if self._transport is None:
            return
        if self._current is None:
            body = message
            head = _STATUS[status] + _Date.get() + _SERVER + \
                b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" \
                b"connection: close\r\n\r\n" % len(body)
            self._transport.write(head + body)
        self._transport.close()


class HttpServer:
    """Listens on one address and keeps track of open connections for shutdown."""

    def __init__(self, app: App, keepalive_s: float = 5.0,
                 batch: WriteBatch | None = None) -> None:
        self._app = app
        self._keepalive_s = keepalive_s
        self._batch = batch if batch is not None else WriteBatch()
        self._server: asyncio.AbstractServer | None = None
        self.connections: set[Connection] = set()

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self._app, loop, self._keepalive_s, self.connections,
                               self._batch),
            host, port, reuse_address=True, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
