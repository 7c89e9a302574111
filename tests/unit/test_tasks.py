"""Stopping background tasks whose cancellation is swallowed under them (``narwhal.tasks``,
and the loops that use it: the cluster's sync, the HA lease in test_fleet_ha.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from narwhal._narwhal_fast import Board
from narwhal.cluster.sync import ClusterSync
from narwhal.config import Cluster
from narwhal.learning import Learning
from narwhal.tasks import stop_task


def test_stop_task_waits_for_a_task_that_ends_and_gives_up_on_one_that_does_not() -> None:
    async def main() -> None:
        async def ends() -> None:
            await asyncio.sleep(10)

        async def fails_at_cancel() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise RuntimeError("failed while stopping") from None

        async def never_ends() -> None:
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    continue  # swallowed, every time

        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c()) for c in (ends, fails_at_cancel, never_ends)]
        await asyncio.sleep(0)
        assert await stop_task(tasks[0], 1.0) and tasks[0].cancelled()
        assert await stop_task(tasks[1], 1.0) and not tasks[1].cancelled()
        start = loop.time()
        assert not await stop_task(tasks[2], 0.1)
        assert loop.time() - start >= 0.09 and not tasks[2].done()
        tasks[2].get_coro().close()  # type: ignore[union-attr]

    asyncio.run(main())


class SwallowingStore:
    """A cluster store whose ``sync``, like redis-py with a command in flight, finishes the
    call it was cancelled in and returns normally."""

    def __init__(self) -> None:
        self.in_sync = asyncio.Event()
        self.swallowed = 0
        self.syncs = 0
        self.left = self.closed = False

    async def claim(self, instance: str, ttl_ms: int, asks: Any) -> tuple[Any, Any]:
        return {}, {}

    async def sync(self, member: str, ttl_ms: int, load: Any, seen: int) -> tuple[Any, ...]:
        self.syncs += 1
        self.in_sync.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.swallowed += 1
        finally:
            self.in_sync.clear()
        return 0, {}, []

    async def publish(self, kind: str, member: str, doc: Any) -> None:
        pass

    async def leave(self, instance: str | None, member: str) -> None:
        self.left = True

    async def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(20)  # without the stop flag, the loop (and so asyncio.run) never ends
def test_cluster_sync_stops_when_a_round_swallows_its_cancellation() -> None:
    async def main() -> None:
        config = Cluster(backend="redis", url="redis://127.0.0.1:1/0", sync_interval_ms=10)
        sync = ClusterSync(config, [], Board(engines=1), Learning([]), on_grow=lambda: None)
        store = SwallowingStore()
        await sync.start(store)  # type: ignore[arg-type]
        assert sync.syncs == [1, 0] and not sync.degraded
        while store.syncs < 2 or not store.in_sync.is_set():  # a round of the loop is in sync
            await asyncio.sleep(0.001)
        stopping = asyncio.ensure_future(sync.stop())
        done, _ = await asyncio.wait({stopping}, timeout=5)
        assert done, "the sync loop went on after its cancellation was swallowed"
        assert store.swallowed == 1
        assert store.left and store.closed  # it left the cluster, as on any stop
        assert sync.store is None

    asyncio.run(main())
