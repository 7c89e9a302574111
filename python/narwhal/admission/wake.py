"""Wake-ups between worker processes: a freed slot in one worker wakes the queues of the others."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence


class WorkerWake:
    """One pipe per worker; a worker writes a byte to its peers' pipes when capacity frees.

    The shared board enforces the limits; this only tells the other workers' admission
    queues to look again, so a request queued in one worker is placed as soon as a slot
    frees in another — without polling.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read_fd: int,
        peer_fds: Sequence[int],
        on_wake: Callable[[], None],
        on_admin: Callable[[], None] | None = None,
    ):
        self.loop = loop
        self.read_fd = read_fd
        self.peer_fds = list(peer_fds)
        self.on_wake = on_wake
        self.on_admin = on_admin
        for fd in (read_fd, *self.peer_fds):
            os.set_blocking(fd, False)
        loop.add_reader(read_fd, self._readable)

    def notify(self, what: bytes = b"w") -> None:
        """``b"w"``: capacity freed; ``b"a"``: the shared admin state changed."""
        for fd in self.peer_fds:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(fd, what)  # a full pipe already holds a pending wake-up

    def notify_admin(self) -> None:
        self.notify(b"a")

    def _readable(self) -> None:
        admin = False
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self.read_fd, 4096):
                admin = admin or b"a" in data
        if admin and self.on_admin is not None:
            self.on_admin()
        self.on_wake()

    def close(self) -> None:
        self.loop.remove_reader(self.read_fd)
