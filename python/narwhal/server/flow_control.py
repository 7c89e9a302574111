"""Write-side flow control of one client connection: pause/resume hooks and drain()."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class FlowControl:
    """Tracks whether the client's transport buffer is over its high-water mark.

    The transport calls ``pause_writing``/``resume_writing`` on the protocol, which forwards
    them here. Two kinds of listeners exist: coroutines awaiting :meth:`drain`, and a pair
    of plain callbacks (set by the relay) that pause and resume reading from the engine, so
    a slow client slows the engine stream without an await per token.
    """

    __slots__ = ("_drain_waiter", "_on_pause", "_on_resume", "write_paused")

    def __init__(self) -> None:
        self.write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._on_pause: Callable[[], None] | None = None
        self._on_resume: Callable[[], None] | None = None

    def set_listener(
        self, on_pause: Callable[[], None] | None, on_resume: Callable[[], None] | None
    ) -> None:
        """Install (or with ``None``, remove) the relay's pause/resume callbacks."""
        self._on_pause = on_pause
        self._on_resume = on_resume
        if on_pause is not None and self.write_paused:
            on_pause()

    def pause_writing(self) -> None:
        if self.write_paused:
            return
        self.write_paused = True
        if self._on_pause is not None:
            self._on_pause()

    def resume_writing(self) -> None:
        if not self.write_paused:
            return
        self.write_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._on_resume is not None:
            self._on_resume()

    async def drain(self) -> None:
        """Wait until the client's buffer is under the low-water mark (or the client left)."""
        if not self.write_paused:
            return
        if self._drain_waiter is None:
            self._drain_waiter = asyncio.get_running_loop().create_future()
        await self._drain_waiter

    def release(self) -> None:
        """Connection lost: release every waiter so nothing hangs on a dead socket."""
        self.write_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._on_pause = None
        self._on_resume = None
