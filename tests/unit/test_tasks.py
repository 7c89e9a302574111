"""Stopping background loops whose cancellation is swallowed under them (``narwhal.tasks``):
the cluster's sync, the health probes and discovery here, the HA lease in test_fleet_ha.py.

Each loop's round is replaced by one that, like ``asyncio.wait_for`` on CPython 3.11 or
redis-py when the call completes in the cancelling turn, returns normally from the call it
was cancelled in. Without the loops' stop flags, ``stop()`` waits forever (the tests are
bounded, and asyncio.run's clean-up then hangs until the test's timeout)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cancel_helpers import Round, stop_in_a_round

from narwhal._narwhal_fast import Board
from narwhal.cluster.sync import ClusterSync
from narwhal.config import Cluster, Discovery, EngineConfig, Health
from narwhal.control.discovery import Discovery as DiscoveryLoops
from narwhal.fleet.engine import Engine
from narwhal.fleet.health import HealthMonitor
from narwhal.learning import Learning
from narwhal.tasks import stop_task
from narwhal.upstream.client import EngineClient

pytestmark = pytest.mark.timeout(20)


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
    """A cluster store whose ``sync`` swallows a cancellation (as redis-py can)."""

    def __init__(self) -> None:
        self.round = Round()
        self.left = self.closed = False

    async def claim(self, instance: str, ttl_ms: int, asks: Any) -> tuple[Any, Any]:
        return {}, {}

    async def sync(self, member: str, ttl_ms: int, load: Any, seen: int) -> tuple[Any, ...]:
        await self.round()
        return 0, {}, []

    async def publish(self, kind: str, member: str, doc: Any) -> None:
        pass

    async def leave(self, instance: str | None, member: str) -> None:
        self.left = True

    async def close(self) -> None:
        self.closed = True


def test_cluster_sync_stops_when_a_round_swallows_its_cancellation() -> None:
    async def main() -> None:
        config = Cluster(backend="redis", url="redis://127.0.0.1:1/0", sync_interval_ms=10)
        sync = ClusterSync(config, [], Board(engines=1), Learning([]), on_grow=lambda: None)
        store = SwallowingStore()
        await sync.start(store)  # type: ignore[arg-type]
        assert sync.syncs == [1, 0] and not sync.degraded
        await stop_in_a_round(store.round, sync.stop)
        assert store.left and store.closed  # it left the cluster, as on any stop
        assert sync.store is None

    asyncio.run(main())


class SwallowingMonitor(HealthMonitor):
    probe_round = Round()

    async def probe_all(self) -> None:
        await self.probe_round()


def test_health_monitor_stops_when_a_probe_round_swallows_its_cancellation() -> None:
    async def main() -> None:
        cfg = EngineConfig(name="e0", url="http://127.0.0.1:1")
        engine = Engine(0, cfg, EngineClient(cfg.url))
        monitor = SwallowingMonitor([engine], Health(interval_s=0.01), lambda e: None)
        monitor.probe_round = Round()
        monitor.start()
        await stop_in_a_round(monitor.probe_round, monitor.stop)
        await engine.client.close()

    asyncio.run(main())


class SwallowingDiscovery(DiscoveryLoops):
    file_round = Round()

    async def _file_round(self, path: str) -> None:
        await self.file_round(path)


def test_discovery_stops_when_a_round_swallows_its_cancellation() -> None:
    async def main() -> None:
        discovery = SwallowingDiscovery(Discovery(file="engines.yaml", interval_s=0.01),
                                        sink=None)  # type: ignore[arg-type]
        discovery.file_round = Round()
        await discovery.start()
        await stop_in_a_round(discovery.file_round, discovery.stop)

    asyncio.run(main())
