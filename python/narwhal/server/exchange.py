"""One HTTP exchange: the parsed request, an early answer, and the response writer; and
what the server asks of the application (:class:`App`) within its limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from narwhal.server.flow_control import FlowControl
from narwhal.server.responses import STATUS_LINES

Headers = Sequence[tuple[bytes, bytes]]

_CHUNK_END = b"0\r\n\r\n"
_KEEP_ALIVE = b"connection: keep-alive\r\n"
_CLOSE = b"connection: close\r\n"


class EarlyResponse(Exception):
    """Raised by ``App.on_headers`` to answer before the body is read (e.g. 413, 429)."""

    def __init__(self, status: int, body: bytes, headers: Headers = (), close: bool = False):
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers
        self.close = close


class Request:
    """One parsed HTTP request."""

    __slots__ = (
        "arrival",
        "body",
        "body_parts",
        "body_size",
        "early",
        "headers",
        "keep_alive",
        "method",
        "path",
        "peer",
        "query",
        "state",
    )

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], arrival: float):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.arrival = arrival
        self.body = b""
        self.body_parts: list[bytes] = []
        self.body_size = 0
        self.keep_alive = True
        self.state: Any = None
        self.early: EarlyResponse | None = None
        self.peer: tuple[Any, ...] | None = None  # the client's address (host, port, ...)


class Connection(Protocol):
    """What a responder needs from its client connection (``server.http.HttpProtocol``)."""

    flow: FlowControl
    transport: asyncio.Transport | None
    closing: bool

    def transport_write(self, data: bytes) -> None: ...

    def exchange_done(self, responder: Responder) -> None: ...

    def close(self) -> None: ...


class Responder:
    """The response side of one exchange."""

    __slots__ = (
        "_conn",
        "_head",
        "_keep_alive",
        "complete",
        "disconnected",
        "on_disconnect",
        "started",
        "status",
    )

    def __init__(self, conn: Connection, keep_alive: bool):
        self._conn = conn
        self._keep_alive = keep_alive
        self._head: bytes | None = None
        self.started = False
        self.complete = False
        self.disconnected = False
        self.on_disconnect: Callable[[], None] | None = None
        self.status = 0  # the response's status once it has started

    # -- whole responses -------------------------------------------------------------------
    def send(
        self,
        status: int,
        body: bytes,
        headers: Headers = (),
        content_type: bytes = b"application/json",
    ) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.complete = True
        self.status = status
        conn = self._conn
        if self.disconnected:
            conn.exchange_done(self)
            return
        parts = [
            STATUS_LINES[status],
            b"content-type: ",
            content_type,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
        ]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        parts += (_KEEP_ALIVE if self._keep_alive else _CLOSE, b"\r\n", body)
        conn.transport_write(b"".join(parts))
        conn.exchange_done(self)

    # -- streamed responses ----------------------------------------------------------------
    def start(
        self,
        status: int,
        headers: Headers = (),
        content_type: bytes = b"text/event-stream; charset=utf-8",
    ) -> None:
        """Begin a chunked response; the head goes out with the first :meth:`write`."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        parts = [STATUS_LINES[status], b"content-type: ", content_type, b"\r\n"]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        parts += (
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n",
            _KEEP_ALIVE if self._keep_alive else _CLOSE,
            b"\r\n",
        )
        self._head = b"".join(parts)

    def write(self, data: bytes) -> None:
        """Send one chunk (all the output of one engine read, coalesced)."""
        if not data or self.disconnected:
            return
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        head, self._head = self._head, None
        self._conn.transport_write(head + chunk if head is not None else chunk)

    def end(self, data: bytes = b"") -> None:
        """Finish the chunked body; a last chunk of ``data`` goes out in the same write."""
        if self.complete:
            return
        self.complete = True
        if not self.disconnected:
            head, self._head = self._head, None
            tail = b"%x\r\n%b\r\n%b" % (len(data), data, _CHUNK_END) if data else _CHUNK_END
            self._conn.transport_write(head + tail if head is not None else tail)
        self._conn.exchange_done(self)

    def raw_writer(self) -> Callable[[bytes], object] | None:
        """The client transport's own ``write``, for body chunks framed by the caller (the
        relay's fast path), once the head is out; None before, or when the client is gone.
        Writes through it skip the checks of :meth:`write`: the caller stops at disconnect."""
        conn = self._conn
        transport = conn.transport
        if (not self.started or self._head is not None or self.complete or self.disconnected
                or conn.closing or transport is None):
            return None
        return transport.write

    # -- flow control and failure ----------------------------------------------------------
    @property
    def write_paused(self) -> bool:
        return self._conn.flow.write_paused

    def set_flow_listener(
        self, on_pause: Callable[[], None] | None, on_resume: Callable[[], None] | None
    ) -> None:
        self._conn.flow.set_listener(on_pause, on_resume)

    async def drain(self) -> None:
        await self._conn.flow.drain()

    def abort(self) -> None:
        """Close the connection now (used when a streamed response cannot be finished)."""
        self.complete = True
        self._conn.close()

    def _lost(self) -> None:
        self.disconnected = True
        callback, self.on_disconnect = self.on_disconnect, None
        if callback is not None:
            callback()


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """HTTP-layer limits (from ``serving`` in the configuration)."""

    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 5.0
    max_header_bytes: int = 65536
    max_headers: int = 100
    max_request_bytes: int = 1048576
    write_buffer_high_bytes: int = 262144


class App(Protocol):
    """What the server needs from the application."""

    def on_headers(self, request: Request) -> None:
        """Called when headers are complete; may raise EarlyResponse."""

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        """A body (chunked, or lying about its length) crossed ``max_request_bytes``."""

    def on_abandon(self, request: Request, *, malformed: bool = False) -> None:
        """The request ended before its handler started: the client left (mid-upload or
        pipelined), or, ``malformed``, its body broke the HTTP framing (answered 400)."""

    def handle(self, request: Request, responder: Responder) -> Awaitable[None]:
        """Answer the request through the responder."""
