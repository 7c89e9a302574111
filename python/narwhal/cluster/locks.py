"""Profiling across instances: one instance profiles an engine at a time (a Redis lock).

Wraps the workers' own per-engine lock (``learning/workers.py``): a worker first takes its
instance's turn, then the cluster's. Without Redis the cluster's lock is skipped (profiling
must not wait on a store that is down); a holder that dies leaves the lock to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from narwhal.cluster.store import RedisStore

log = logging.getLogger("narwhal.cluster")

LOCK_TTL_MS = 60_000
"""A profile lock's lifetime in Redis (a profile takes seconds; a dead holder's expires)."""
LOCK_WAIT_S = 30.0
POLL_S = 0.05


class Locks(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...
    def hold(self, index: int) -> AbstractAsyncContextManager[bool]: ...


class ClusterLocks:
    """Per-engine profiling locks held across the instances of a cluster."""

    def __init__(self, inner: Locks, store: Callable[[], RedisStore | None],
                 name_of: Callable[[int], str]) -> None:
        self.inner = inner
        self.store = store
        self.name_of = name_of
        self.token = secrets.token_hex(8)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    @contextlib.asynccontextmanager
    async def hold(self, index: int) -> AsyncIterator[bool]:
        async with self.inner.hold(index) as local:
            name = f"profile:{self.name_of(index)}"
            held = await self._acquire(name)
            try:
                yield local and held
            finally:
                store = self.store()
                if held and store is not None:
                    with contextlib.suppress(Exception):
                        await store.unlock(name, self.token)

    async def _acquire(self, name: str) -> bool:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            store = self.store()
            if store is None:
                return False
            try:
                if await store.try_lock(name, self.token, LOCK_TTL_MS):
                    return True
            except Exception as exc:  # Redis down: profile without the cluster's turn
                log.warning("cluster profiling lock %s unavailable: %s", name, exc)
                return False
            if time.monotonic() >= deadline:
                log.warning("cluster profiling lock %s not free after %.0f s", name,
                            LOCK_WAIT_S)
                return False
            await asyncio.sleep(POLL_S)
