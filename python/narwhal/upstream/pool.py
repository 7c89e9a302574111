"""EngineClient: one engine's keep-alive connection pool, request serialisation and retries."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from collections.abc import Sequence
from urllib.parse import urlsplit

from narwhal.upstream.connection import EngineConnection, StaleConnection
from narwhal.upstream.response import UpstreamError, UpstreamResponse

_BAD_PATH = re.compile(r"[\x00-\x20\x7f]")
_BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _check_headers(headers: Sequence[tuple[bytes, bytes]]) -> None:
    for name, value in headers:
        if not name or _BAD_NAME.search(name) or _BAD_VALUE.search(value):
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")


class EngineClient:
    """HTTP/1.1 client for one engine: pooled keep-alive connections with TCP_NODELAY."""

    def __init__(self, url: str, *, loop: asyncio.AbstractEventLoop | None = None,
                 connect_timeout_s: float = 2.0, max_idle: int = 256,
                 headers: Sequence[tuple[bytes, bytes]] = (),
                 idle_timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"engine URL must be http://host[:port][/prefix], got {url!r}")
        _check_headers(headers)
        # shared, fixed at construction
        self.url = url
        self._loop = loop
        self._host = parts.hostname
        self._port = parts.port or 80
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._idle_timeout_s = idle_timeout_s
        self._path_prefix = parts.path.rstrip("/").encode("ascii")
        self._host_line = b"Host: " + parts.netloc.encode("idna") + b"\r\n"
        self._lines: dict[tuple[str, str], bytes] = {}  # request lines built so far
        self._fixed_tail = b"Accept: */*\r\n" + b"".join(
            name + b": " + value + b"\r\n" for name, value in headers)
        # pool state
        self._idle: deque[EngineConnection] = deque()   # most recently used on the right
        self._all: set[EngineConnection] = set()
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    @property
    def open_connections(self) -> int:
        return len(self._all)

    async def open(self, method: str, path: str, body: bytes = b"",
                   headers: Sequence[tuple[bytes, bytes]] = (), *,
                   timeout_s: float) -> UpstreamResponse:
        """Send a request; return at its response headers (``timeout_s`` includes connecting).

        Raises UpstreamError(before_headers=True). A pooled connection that turns out dead
        before any response byte is retried once on a fresh connection.
        """
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        data = self._serialize(method, path, body, headers)
        head = method == "HEAD"
        conn = self._take_idle()
        if conn is not None:
            try:
                return await conn.request(data, head=head, deadline=deadline)
            except StaleConnection:
                pass                          # nothing was processed: retry on a new socket
        conn = await self._connect(loop, deadline)
        try:
            return await conn.request(data, head=head, deadline=deadline)
        except StaleConnection as exc:       # a fresh socket never counts as stale
            raise UpstreamError(exc.kind, exc.message) from None

    async def fetch(self, method: str, path: str, body: bytes = b"",
                    headers: Sequence[tuple[bytes, bytes]] = (), *, timeout_s: float,
                    limit: int = 16 << 20) -> tuple[int, dict[str, str], bytes]:
        """The whole response (probes, profiling); ``timeout_s`` bounds headers and body."""
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        resp = await self.open(method, path, body, headers, timeout_s=timeout_s)
        data = await resp.read_all(limit, timeout_s=max(0.0, deadline - loop.time()))
        return resp.status, resp.headers, data

    async def close(self) -> None:
        """Close idle connections; connections in use close when their response ends."""
        self._closed = True
        closing = list(self._idle)
        self._idle.clear()
        for conn in closing:
            conn.close()
        if closing:
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in closing],
                               timeout=1.0)

    # -- the ConnectionOwner side: called by EngineConnection ----------------------------

    def connection_made(self, conn: EngineConnection) -> None:
        self._all.add(conn)

    def connection_lost(self, conn: EngineConnection) -> None:
        self._all.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)           # an idle socket the engine (or the timer) closed

    def release(self, conn: EngineConnection) -> None:
        """A response ended cleanly with keep-alive: pool the connection or close it."""
        if self._closed or len(self._idle) >= self._max_idle:
            conn.close()
            return
        loop = self._loop or asyncio.get_running_loop()
        conn.idle_timer = loop.call_later(self._idle_timeout_s, conn.close)
        self._idle.append(conn)

    # -- internals ---------------------------------------------------------------------

    def _take_idle(self) -> EngineConnection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if conn.reusable:
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> EngineConnection:
        if self._closed:
            raise UpstreamError("connect", f"client for {self.url} is closed")
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise UpstreamError("timeout", "no time left to connect")
        limit = min(remaining, self._connect_timeout_s)
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: EngineConnection(loop, self),
                                       self._host, self._port),
                limit)
        except (asyncio.TimeoutError, TimeoutError):
            kind = "timeout" if remaining <= self._connect_timeout_s else "connect"
            raise UpstreamError(kind, f"connect to {self.url} took over {limit:.3g}s") from None
        except OSError as exc:
            raise UpstreamError("connect", f"connect to {self.url}: {exc}") from exc
        return conn

    def _request_line(self, method: str, path: str) -> bytes:
        """The request line and Host header of ``method path`` (checked and built once)."""
        line = self._lines.get((method, path))
        if line is None:
            if not path.startswith("/") or _BAD_PATH.search(path):
                raise ValueError(f"invalid request path {path!r}")
            line = b"".join((method.encode("ascii"), b" ", self._path_prefix,
                             path.encode("ascii"), b" HTTP/1.1\r\n", self._host_line))
            if len(self._lines) < 256:
                self._lines[(method, path)] = line
        return line

    def _serialize(self, method: str, path: str, body: bytes,
                   headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        if headers:
            _check_headers(headers)
        parts = [self._request_line(method, path)]
        if body or method in _BODY_METHODS:
            parts += (b"Content-Length: ", str(len(body)).encode("ascii"), b"\r\n")
        if body and not any(name.lower() == b"content-type" for name, _ in headers):
            parts.append(b"Content-Type: application/json\r\n")
        parts.append(self._fixed_tail)
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        parts += (b"\r\n", body)
        return b"".join(parts)
