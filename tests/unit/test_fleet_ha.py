"""HA role keepers: the fixed role, and the Redis lease against a real redis-server (acquire,
compare-and-extend, expiry takeover, self-fencing, epoch monotonicity, release)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from cancel_helpers import Round, stop_in_a_round

from narwhal.config import Lease
from narwhal.fleet.ha import SERVE_FRACTION, RedisLease, StaticRole, make_role

TTL = 0.6


def test_static_role() -> None:
    role = StaticRole("standby")
    assert role.refusal() == "router_standby" and not role.lease_managed
    role.set_role("active")
    assert role.refusal() is None
    assert role.describe() == {"role": "active", "lease": None}
    assert isinstance(make_role("active", Lease()), StaticRole)


class Redis:
    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None

    def lease(self, token: str, key: str = "test:lease") -> RedisLease:
        config = Lease(backend="redis", url=f"redis://127.0.0.1:{self.port}/0", key=key,
                       ttl_s=TTL)
        return RedisLease(config, token=token)


@pytest.fixture
def redis() -> Iterator[Redis]:
    server = Redis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def until(pred: Callable[[], bool], timeout: float) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not pred():
        assert loop.time() - start < timeout, "condition not met in time"
        await asyncio.sleep(0.01)
    return loop.time() - start


def test_first_instance_holds_the_second_is_standby_and_takes_over_on_release(
    redis: Redis,
) -> None:
    async def body() -> None:
        a, b = redis.lease("A"), redis.lease("B")
        await a.start()
        await b.start()
        assert a.refusal() is None and a.epoch == 1
        assert b.refusal() == "router_standby" and b.describe()["role"] == "standby"
        await asyncio.sleep(TTL * 2)  # renewals keep A in; B cannot extend A's lease
        assert a.refusal() is None and b.refusal() == "router_standby"
        await a.stop()  # hands the lease back
        took = await until(lambda: b.refusal() is None, TTL)
        assert took < TTL / 2 and b.epoch == 2
        assert a.refusal() == "router_fenced"  # it held the lease once, and lost it
        await b.stop()

    run(body)


def test_a_dead_holder_is_replaced_when_its_lease_expires(redis: Redis) -> None:
    async def body() -> None:
        a, b = redis.lease("A"), redis.lease("B")
        await a.start()
        await b.start()
        assert a._task is not None
        a._task.cancel()  # A dies: no renewal, no release
        took = await until(lambda: b.refusal() is None, TTL * 2)
        assert took <= TTL + 0.2, took
        assert b.epoch == 2
        await until(lambda: a.refusal() is not None, TTL)  # A's own clock fenced it
        await b.stop()

    run(body)


def test_holder_fences_itself_before_its_lease_could_expire_and_recovers(
    redis: Redis,
) -> None:
    async def body() -> None:
        a = redis.lease("A")
        await a.start()
        await asyncio.sleep(TTL / 2)
        assert a.refusal() is None
        stopped = asyncio.get_running_loop().time()
        redis.stop()
        await until(lambda: a.refusal() == "router_fenced", 5)
        # Fenced by its own clock at most SERVE_FRACTION * TTL after the stop (its last
        # renewal was sent before it), whenever this loop got round to looking.
        assert a.valid_until - stopped <= SERVE_FRACTION * TTL, a.valid_until - stopped
        assert a.describe()["lease"]["last_error"]
        assert a.describe()["role"] == "fenced"
        await asyncio.sleep(0.15)  # a renewal attempt sees it (redis.start blocks the loop)
        # Redis comes back empty: the lease is free, and the epoch does not go backwards.
        redis.start()
        await until(lambda: a.refusal() is None, 5)
        assert a.epoch == 2, a.epoch
        await a.stop()

    run(body)


def test_workers_of_one_instance_share_the_lease(redis: Redis) -> None:
    async def body() -> None:
        w1, w2, other = redis.lease("I"), redis.lease("I"), redis.lease("J")
        for lease in (w1, w2, other):
            await lease.start()
        assert w1.refusal() is None and w2.refusal() is None
        assert w1.epoch == w2.epoch == 1
        assert other.refusal() == "router_standby"
        for lease in (w1, w2, other):
            await lease.stop()

    run(body)


class SwallowingLease(RedisLease):
    """A lease whose claim swallows its cancellation (``asyncio.wait_for`` on 3.11 does when
    the call completes in the cancelling turn), then claims as usual."""

    claim_round: Round

    async def _tick(self) -> float:
        await self.claim_round()
        return await super()._tick()


@pytest.mark.timeout(20)  # without the stop flag, the loop (and so asyncio.run) never ends
def test_stop_ends_the_lease_loop_when_a_claim_swallows_its_cancellation(redis: Redis) -> None:
    async def body() -> None:
        config = Lease(backend="redis", url=f"redis://127.0.0.1:{redis.port}/0",
                       key="test:lease", ttl_s=TTL)
        a = SwallowingLease(config, token="A")
        a.claim_round = Round()
        await a.start()
        await stop_in_a_round(a.claim_round, a.stop)
        assert a.refusal() == "router_fenced"  # and the lease was handed back:
        b = redis.lease("B")
        await b.start()
        assert b.refusal() is None  # B holds it at once, not after the TTL
        await b.stop()

    asyncio.run(body())
