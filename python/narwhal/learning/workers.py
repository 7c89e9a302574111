"""Profiling across worker processes: one worker profiles an engine at a time.

Workers (``narwhal serve --workers N``) share the accounting board's file; a POSIX record
lock on one byte per engine (far past the mapped data) makes the workers take turns, so
one worker's probes never queue behind another's and skew its fit. With a state file, a
worker that gets the lock after another has just profiled the engine adopts that profile
instead of probing again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

log = logging.getLogger("narwhal.learning")

LOCK_OFFSET = 1 << 40
LOCK_WAIT_S = 30.0
"""After this long without the lock, a worker profiles anyway (a stuck peer must not stop it)."""


class ProfileLocks(Protocol):
    """Per-engine profiling turns: the workers' (:class:`WorkerLocks`), or a cluster's
    wrapping them (``cluster/locks.py``). ``hold`` yields whether the turn is held."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def hold(self, index: int) -> AbstractAsyncContextManager[bool]: ...


class WorkerLocks:
    """Per-engine profiling locks on a file every worker opens (None: a single process)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None

    def open(self) -> None:
        if self.path is not None and self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR)
            except OSError as exc:
                log.warning("no cross-worker profiling lock (%s): %s", self.path, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.asynccontextmanager
    async def hold(self, index: int) -> AsyncIterator[bool]:
        """Hold engine ``index``'s lock (polling, bounded); yields whether it is held."""
        fd = self._fd
        locked = False
        if fd is not None:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, LOCK_OFFSET + index)
                    locked = True
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        log.warning("profiling lock of engine %d not free after %.0f s",
                                    index, LOCK_WAIT_S)
                        break
                    await asyncio.sleep(0.05)
        try:
            yield locked
        finally:
            if locked and self._fd is not None:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, LOCK_OFFSET + index)
