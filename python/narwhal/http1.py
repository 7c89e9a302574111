"""HTTP/1.1 pieces the client-facing server and the engine client share: header merging and
the write side of a connection's flow control."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


def merge_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Header fields as a dict with lower-cased names; repeated fields join with ", "."""
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


class WriteGate:
    """Whether a transport's write buffer is over its high-water mark, and one waiter for it
    to drain. ``release`` (connection lost) lets the waiter go so nothing hangs."""

    __slots__ = ("_drain_waiter", "write_paused")

    def __init__(self) -> None:
        self.write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.wake()

    async def drain(self) -> None:
        """Wait while writing is paused (returns at once otherwise)."""
        if not self.write_paused:
            return
        if self._drain_waiter is None:
            self._drain_waiter = asyncio.get_running_loop().create_future()
        await self._drain_waiter

    def wake(self) -> None:
        """Release the drain waiter without changing the pause state."""
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def release(self) -> None:
        """Connection lost: nothing will ever be written again."""
        self.write_paused = False
        self.wake()
