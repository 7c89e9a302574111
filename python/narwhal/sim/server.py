"""``Simulator``: one simulated vLLM engine (HTTP server, engine scheduler, routes) in a loop."""

from __future__ import annotations

import asyncio

from narwhal.sim.app import SimApp
from narwhal.sim.engine import Engine
from narwhal.sim.http import HttpServer, WriteBatch
from narwhal.sim.settings import SimSettings


class Simulator:
    """Run in-process: ``port = await sim.start(host, port)`` ... ``await sim.stop()``."""

    def __init__(self, settings: SimSettings | None = None) -> None:
        self.settings = settings if settings is not None else SimSettings()
        self.host = "127.0.0.1"
        self.port = 0
        self.app: SimApp | None = None
        self._engine: Engine | None = None
        self._server: HttpServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0 picks a free port); return the bound port."""
        if self._server is not None:
            raise RuntimeError("simulator already started")
        loop = asyncio.get_running_loop()
        batch = WriteBatch()
        self._engine = Engine(self.settings, loop, batch)
        self.app = SimApp(self.settings, self._engine)
        self._server = HttpServer(self.app, self.settings.keepalive_timeout_s, batch)
        self.host = host
        self.port = await self._server.start(host, port)
        return self.port

    async def stop(self) -> None:
        """Stop listening, close every connection and stop the engine's timers."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None
