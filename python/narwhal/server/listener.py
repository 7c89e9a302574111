"""The listening side of the HTTP server: sockets, the set of live connections, and the
graceful drain (one :class:`~narwhal.server.http.HttpProtocol` per accepted connection)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from narwhal.server.exchange import App, Request, ServerLimits
from narwhal.server.http import HttpProtocol

__all__ = ["HttpServer"]


class HttpServer:
    """Listening sockets and the set of live connections."""

    def __init__(
        self,
        app: App,
        limits: ServerLimits,
        loop: asyncio.AbstractEventLoop,
        log_exception: Callable[[Request], None] | None = None,
    ):
        self.app = app
        self.limits = limits
        self.loop = loop
        self.connections: set[HttpProtocol] = set()
        self.draining = False
        self._servers: list[asyncio.AbstractServer] = []
        self._log_exception = log_exception

    def log_exception(self, request: Request) -> None:
        if self._log_exception is not None:
            self._log_exception(request)

    async def listen(
        self, host: str, port: int, *, reuse_port: bool = False, sock: socket.socket | None = None
    ) -> int:
        """Start listening; returns the bound port."""
        if sock is not None:
            server = await self.loop.create_server(lambda: HttpProtocol(self), sock=sock)
        else:
            server = await self.loop.create_server(
                lambda: HttpProtocol(self), host, port, reuse_port=reuse_port or None, backlog=4096
            )
        self._servers.append(server)
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    def stop_accepting(self) -> None:
        self.draining = True
        for server in self._servers:
            server.close()

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting, let in-flight exchanges finish within ``grace_s``, then close."""
        self.stop_accepting()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + grace_s
        while self.connections and self.loop.time() < deadline:
            for conn in list(self.connections):
                conn.shutdown()
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
