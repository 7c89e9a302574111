"""HA with a Redis lease: two real router processes and a real redis-server. The active
instance holds the lease; killing it hands the role to the standby within the TTL; losing
Redis fences the active instance within the TTL; SIGTERM hands the lease over at once."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import (
    ADMIN_ENV,
    ADMIN_SECTION,
    Counters,
    RedisServer,
    admin,
    assert_refused,
    complete,
    fleet_config,
    ready,
    redis_server,
    start_sim_on,
    wait_for,
)
from procs import Proc, free_port, start_router

pytestmark = pytest.mark.timeout(120)

TTL = 2.0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start_sim_on(0)
    try:
        yield proc
    finally:
        proc.stop()


def start(tmp: Path, sim: Proc, redis: RedisServer, role: str = "active") -> Proc:
    lease = {"backend": "redis", "url": redis.url, "key": "narwhal-test:lease", "ttl_s": TTL}
    config = fleet_config([sim.url], ha={"role": role, "lease": lease}, admin=ADMIN_SECTION)
    return start_router(tmp, config, env=ADMIN_ENV)


def lease_of(router: Proc) -> dict[str, Any]:
    status, _, state = admin(router.url, "/admin/state", method="GET")
    assert status == 200
    return dict(state["ha"]["lease"])


def serving(router: Proc) -> bool:
    return ready(router.url)[0] == 200


def test_standby_takes_over_within_ttl_when_the_active_dies(
    tmp_path: Path, sim: Proc, redis: RedisServer
) -> None:
    active = start(tmp_path, sim, redis)
    standby = start(tmp_path, sim, redis, role="standby")
    try:
        assert ready(active.url) == (200, {"ready": True})
        assert ready(standby.url) == (503, {"ready": False, "reason": "standby"})
        counters = Counters(standby.url)
        assert_refused(complete(standby.url), 503, "router_standby")
        assert complete(active.url)[0] == 200
        first = lease_of(active)
        assert first["held"] and first["epoch"] >= 1 and not lease_of(standby)["held"]

        active.signal(signal.SIGKILL)  # no release: the lease must expire
        killed = time.monotonic()
        wait_for(lambda: serving(standby), timeout=TTL * 3, every=0.02)
        took = time.monotonic() - killed
        assert took <= TTL + 0.5, f"standby took {took:.2f}s (ttl {TTL}s)"
        print(f"failover after SIGKILL of the active: {took:.2f}s (ttl {TTL}s)")
        assert complete(standby.url)[0] == 200
        assert lease_of(standby)["epoch"] == first["epoch"] + 1

        delta = counters.settled()
        assert delta['narwhal_rejected_total{reason="router_standby"}'] == 1
        assert delta["narwhal_completed_total"] == 1 and delta["narwhal_offered_total"] == 2
    finally:
        active.stop()
        standby.stop()


def test_active_fences_itself_within_ttl_when_redis_goes_away(
    tmp_path: Path, sim: Proc, redis: RedisServer
) -> None:
    router = start(tmp_path, sim, redis)
    try:
        assert serving(router)
        epoch = lease_of(router)["epoch"]
        counters = Counters(router.url)
        redis.stop()
        stopped = time.monotonic()
        wait_for(lambda: ready(router.url)[1].get("reason") == "fenced", timeout=TTL * 2,
                 every=0.02)
        took = time.monotonic() - stopped
        assert took <= TTL, f"fenced after {took:.2f}s (ttl {TTL}s)"
        print(f"active fenced {took:.2f}s after Redis stopped (ttl {TTL}s)")
        assert ready(router.url) == (503, {"ready": False, "reason": "fenced"})
        assert_refused(complete(router.url), 503, "router_fenced")
        state = lease_of(router)
        assert not state["held"] and state["last_error"]

        # Redis is back (empty): the instance takes the lease again, with a higher epoch.
        redis.start()
        wait_for(lambda: serving(router), timeout=TTL * 3)
        assert lease_of(router)["epoch"] == epoch + 1
        assert complete(router.url)[0] == 200
        delta = counters.settled()
        assert delta['narwhal_rejected_total{reason="router_fenced"}'] == 1
        assert delta["narwhal_completed_total"] == 1
    finally:
        router.stop()


def test_sigterm_hands_the_lease_to_the_standby_at_once(
    tmp_path: Path, sim: Proc, redis: RedisServer
) -> None:
    active = start(tmp_path, sim, redis)
    standby = start(tmp_path, sim, redis)  # the role key does not matter with a lease
    try:
        assert serving(active) and not serving(standby)
        active.signal(signal.SIGTERM)
        stopped = time.monotonic()
        wait_for(lambda: serving(standby), timeout=TTL * 2, every=0.02)
        took = time.monotonic() - stopped
        assert took < TTL / 4, f"handover took {took:.2f}s"
        print(f"handover after SIGTERM of the active: {took:.2f}s (ttl {TTL}s)")
        assert active.wait(15) == 0
    finally:
        active.stop()
        standby.stop()


def test_role_route_conflicts_with_a_lease_backend(
    tmp_path: Path, sim: Proc, redis: RedisServer
) -> None:
    router = start(tmp_path, sim, redis)
    try:
        status, _, body = admin(router.url, "/admin/role", {"role": "standby"})
        assert status == 409 and body["error"]["code"] == "conflict"
        assert body["error"]["param"] == "role"
        assert serving(router)
    finally:
        router.stop()


def test_fenced_router_stays_fenced_while_another_holds_the_lease(
    tmp_path: Path, sim: Proc
) -> None:
    port = free_port()
    redis = RedisServer(port).start()
    a = start(tmp_path, sim, redis)
    b = start(tmp_path, sim, redis)
    try:
        assert serving(a) and not serving(b)
        a.signal(signal.SIGSTOP)  # a stalls past its lease; b takes over
        wait_for(lambda: serving(b), timeout=TTL * 3)
        a.signal(signal.SIGCONT)
        # a resumes: its own clock says its lease is gone, and b holds the lease now.
        assert ready(a.url) == (503, {"ready": False, "reason": "fenced"})
        assert_refused(complete(a.url), 503, "router_fenced")
        time.sleep(TTL)
        assert ready(a.url)[1]["reason"] == "fenced" and serving(b)
        assert lease_of(b)["epoch"] == lease_of(a)["epoch"] + 1
    finally:
        a.signal(signal.SIGCONT)
        a.stop()
        b.stop()
        redis.stop()
