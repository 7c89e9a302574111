"""Health monitor: eviction and restore counting, and which probe outcomes establish an
engine's state (monitoring staleness), against real loopback sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Awaitable, Callable

from narwhal.config import EngineConfig, Health
from narwhal.fleet.engine import Engine
from narwhal.fleet.engine import Health as State
from narwhal.fleet.health import HealthMonitor
from narwhal.upstream.client import EngineClient


def _engine(port: int, name: str = "e0") -> Engine:
    cfg = EngineConfig(name=name, url=f"http://127.0.0.1:{port}")
    return Engine(0, cfg, EngineClient(cfg.url))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _server(answer: bytes | None) -> tuple[asyncio.AbstractServer, int]:
    """A loopback server that answers every request with ``answer``, or never (None)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                if answer is None:
                    await reader.read()
                    return
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
DOWN = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
# Probes of a server that answers get time to be answered on a slow or preempted host (one
# that times out is a failed probe and leaves the state unknown); the hanging test shortens it.
CONFIG = Health(interval_s=0.05, timeout_s=2.0, failures_to_evict=3, successes_to_restore=2,
                monitoring_stale_s=0.3)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_unknown_engine_is_healthy_on_its_first_good_probe_and_evicted_after_three() -> None:
    async def body() -> None:
        server, port = await _server(OK)
        engine = _engine(port)
        changes: list[str] = []
        monitor = HealthMonitor([engine], CONFIG, lambda e: changes.append(e.health.value))
        await monitor.probe_all()
        assert engine.health is State.HEALTHY and changes == ["healthy"]
        server.close()
        await server.wait_closed()
        await engine.client.close()
        for expected in (State.HEALTHY, State.HEALTHY, State.UNHEALTHY):
            await monitor.probe_all()
            assert engine.health is expected
        # A refused connection is a known state: monitoring is not stale.
        assert not monitor.degraded()
        assert changes == ["healthy", "unhealthy"]

    run(body)


def test_restore_needs_consecutive_successes() -> None:
    async def body() -> None:
        server, port = await _server(OK)
        engine = _engine(port)
        monitor = HealthMonitor([engine], CONFIG, lambda e: None)
        engine.health = State.UNHEALTHY
        await monitor.probe_all()
        assert engine.health is State.UNHEALTHY  # one success of two
        await monitor.probe_all()
        assert engine.health is State.HEALTHY
        server.close()
        await engine.client.close()

    run(body)


def test_non_200_answer_fails_the_probe_but_establishes_the_state() -> None:
    async def body() -> None:
        server, port = await _server(DOWN)
        engine = _engine(port)
        monitor = HealthMonitor([engine], CONFIG, lambda e: None)
        await monitor.probe_all()
        assert engine.health is State.UNHEALTHY
        assert monitor.last_established is not None
        await asyncio.sleep(0.35)
        await monitor.probe_all()
        assert not monitor.degraded()
        server.close()
        await engine.client.close()

    run(body)


def test_hanging_probes_leave_the_state_unknown_until_monitoring_is_degraded() -> None:
    async def body() -> None:
        server, port = await _server(None)
        engine = _engine(port)
        monitor = HealthMonitor([engine], dataclasses.replace(CONFIG, timeout_s=0.1),
                                lambda e: None)
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() - start < 0.5:
            await monitor.probe_all()  # each times out after 0.1 s
        assert monitor.last_established is None
        assert monitor.degraded() and monitor.staleness() >= 0.3
        assert engine.health is State.UNHEALTHY  # timeouts still count as failed probes
        server.close()
        await engine.client.close()

    run(body)


def test_a_stalled_monitoring_loop_counts_as_stale() -> None:
    async def body() -> None:
        engine = _engine(_closed_port())
        monitor = HealthMonitor([engine], CONFIG, lambda e: None)
        await monitor.probe_all()  # refused: established
        assert not monitor.degraded()
        # No probe round runs (the loop is "stalled"): staleness grows by the clock alone.
        await asyncio.sleep(0.35)
        assert monitor.degraded()
        await monitor.probe_all()
        assert not monitor.degraded()
        await engine.client.close()

    run(body)


def test_probe_loop_runs_rounds_at_a_fixed_rate() -> None:
    async def body() -> None:
        server, port = await _server(OK)
        engine = _engine(port)
        monitor = HealthMonitor([engine], CONFIG, lambda e: None)
        loop = asyncio.get_running_loop()
        start = loop.time()
        monitor.start()
        while monitor.rounds < 6:
            assert loop.time() - start < 5.0, monitor.rounds
            await asyncio.sleep(0.005)
        took = loop.time() - start
        await monitor.stop()
        # The k-th round starts no sooner than k intervals in (never faster than the rate,
        # however late a round ran); 6 rounds of 0.05 s well under twice that (a host stall
        # may delay rounds, but not by a quarter of a second).
        assert 6 * CONFIG.interval_s - 0.001 <= took < 6 * CONFIG.interval_s + 0.25, took
        server.close()
        await engine.client.close()

    run(body)


def test_breakers_take_the_health_thresholds() -> None:
    engine = _engine(_closed_port())
    HealthMonitor([engine], CONFIG, lambda e: None)
    fleet = engine.breaker.fleet
    assert fleet.threshold == 3 and fleet.max_ejected_percent == 50
    assert abs(fleet.base_s - 0.15) < 1e-9
