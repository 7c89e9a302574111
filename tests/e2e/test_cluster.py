"""Several active routers sharing one fleet through a real redis-server (``cluster:``).

Three router processes (one of them with ``--workers 2``) on their own ports in front of two
simulated engines: the engines' limits hold for the sum of the three under a burst through
all of them; a drain at one instance reaches the others within a second; Redis killed and
restarted under load loses no request and keeps each instance to its fallback share. Two
more routers in predictive mode: load through one makes the other refuse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fleet_support import (
    ADMIN_ENV,
    ADMIN_SECTION,
    Counters,
    RedisServer,
    admin,
    chat,
    complete,
    fleet_config,
    redis_server,
    wait_for,
)
from procs import Proc, get_json, http, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

MAX_PREFILL, MAX_DECODE = 3, 6  # per engine, for the sum of the three instances
INTERVAL_MS = 50


def cluster_section(redis: RedisServer, prefix: str) -> dict[str, Any]:
    return {"backend": "redis", "url": redis.url, "key_prefix": prefix,
            "sync_interval_ms": INTERVAL_MS}


def engines_of(router: Proc) -> dict[str, Any]:
    return dict(get_json(f"{router.url}/engines"))


def profiled(router: Proc, count: int) -> bool:
    """Every engine has a profile and none is running (the probes are over), at whichever
    worker answers (several answers in a row)."""
    for _ in range(4):
        listed = engines_of(router)["engines"]
        if len(listed) != count or not all(
                e["learned"]["profile"]["count"] >= 1 and not e["learned"]["profile"]["running"]
                for e in listed):
            return False
    return True


def cluster_of(router: Proc) -> dict[str, Any]:
    return dict(engines_of(router)["cluster"])


# -- three instances, two engines -------------------------------------------------------------
@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    procs = [start_sim("--tpot-ms", "4", "--prefill-tokens-per-s", "100000",
                       "--output-len", "12") for _ in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory, redis: RedisServer,
            sims: list[Proc]) -> Iterator[list[Proc]]:
    tmp = tmp_path_factory.mktemp("cluster")
    engines = [{"name": f"e{i}", "url": s.url, "max_prefill": MAX_PREFILL,
                "max_decode": MAX_DECODE} for i, s in enumerate(sims)]
    config = fleet_config([s.url for s in sims], engines=engines, admin=ADMIN_SECTION,
                          cluster=cluster_section(redis, "three"))
    started: list[Proc] = []
    try:
        for workers in (2, 1, 1):
            started.append(start_router(tmp, config, "--workers", str(workers), env=ADMIN_ENV))
        for router in started:
            wait_for(lambda r=router: cluster_of(r)["instances"] == 3  # type: ignore[misc]
                     and profiled(r, 2), timeout=20)
        yield started
    finally:
        for router in started:
            router.stop()


def reset(sims: list[Proc]) -> None:
    for sim in sims:
        assert http(sim.url, "POST", "/sim/reset")[0] == 200


def peaks(sims: list[Proc]) -> list[tuple[int, int]]:
    out = []
    for sim in sims:
        stats = get_json(f"{sim.url}/sim/stats")
        out.append((stats["peak_running"], stats["peak_waiting"]))
    return out


def settled_everywhere(routers: list[Proc], counters: list[Counters]) -> list[dict[str, float]]:
    deltas = [c.settled() for c in counters]
    for router in routers:
        m = metrics(router.url)
        for name in ("e0", "e1"):
            for phase in ("prefill", "decode"):
                assert m[f'narwhal_engine_inflight{{engine="{name}",phase="{phase}"}}'] == 0
    return deltas


def test_engine_limits_hold_for_the_sum_of_three_instances(routers: list[Proc],
                                                           sims: list[Proc]) -> None:
    reset(sims)
    counters = [Counters(r.url) for r in routers]

    def one(i: int) -> int:
        return complete(routers[i % 3].url, chat(f"burst {i}", max_tokens=12))[0]

    with ThreadPoolExecutor(60) as pool:
        statuses = list(pool.map(one, range(120)))
    assert statuses == [200] * 120
    for running, waiting in peaks(sims):
        # The simulator's own counts: requests running (both phases on a mixed engine are
        # bounded by max_decode), and queued or in prefill (max_prefill).
        assert running <= MAX_DECODE and waiting <= MAX_PREFILL, peaks(sims)
    assert max(r for r, _ in peaks(sims)) > MAX_DECODE // 3  # more than a fixed third
    deltas = settled_everywhere(routers, counters)
    assert sum(d.get("narwhal_completed_total", 0) for d in deltas) == 120
    assert all(d.get("narwhal_completed_total", 0) > 0 for d in deltas)
    # Each instance's quotas, summed over the instances, stay within the limits.
    for name in ("e0", "e1"):
        for phase, limit in (("prefill", MAX_PREFILL), ("decode", MAX_DECODE)):
            quotas = [metrics(r.url)[f'narwhal_engine_quota{{engine="{name}",phase="{phase}"}}']
                      for r in routers]
            assert sum(quotas) <= limit, quotas


def test_a_drain_at_one_instance_is_honoured_by_all_within_a_second(
        routers: list[Proc], sims: list[Proc]) -> None:
    status, _, _ = admin(routers[1].url, "/admin/engines/e0/drain", {"enabled": True})
    assert status == 200
    try:
        for router in routers:  # both workers of the first router answer in turn
            wait_for(lambda r=router: all(  # type: ignore[misc]
                engines_of(r)["engines"][0]["state"] == "draining" for _ in range(4)),
                timeout=1.0)
        reset(sims)
        for i in range(9):
            assert complete(routers[i % 3].url, chat(f"after drain {i}"))[0] == 200
        assert get_json(f"{sims[0].url}/sim/stats")["peak_running"] == 0
        assert get_json(f"{sims[1].url}/sim/stats")["peak_running"] >= 1
    finally:
        status, _, _ = admin(routers[2].url, "/admin/engines/e0/drain", {"enabled": False})
        assert status == 200
    for router in routers:
        wait_for(lambda r=router: not any(  # type: ignore[misc]
            engines_of(r)["engines"][0]["state"] == "draining" for _ in range(4)),
                timeout=1.0)


def test_redis_lost_and_back_under_load(routers: list[Proc], sims: list[Proc],
                                        redis: RedisServer) -> None:
    """No request is lost while Redis is down and back; each instance keeps to its fallback
    share (limit ÷ 3 instances) meanwhile and says so on /engines and /metrics."""
    reset(sims)
    counters = [Counters(r.url) for r in routers]
    statuses: list[int] = []
    stop = threading.Event()

    def load(k: int) -> None:
        i = 0
        while not stop.is_set():
            statuses.append(complete(routers[k % 3].url, chat(f"under load {k} {i}"))[0])
            i += 1

    threads = [threading.Thread(target=load, args=(k,)) for k in range(9)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(statuses) >= 20)
        redis.stop()
        for router in routers:
            wait_for(lambda r=router: all(  # type: ignore[misc]
                cluster_of(r)["degraded"] for _ in range(4)), timeout=5)
            m = metrics(router.url)
            assert m["narwhal_cluster_degraded"] == 1
            quota = m['narwhal_engine_quota{engine="e0",phase="decode"}']
            assert quota == MAX_DECODE // 3
            assert m['narwhal_engine_quota{engine="e0",phase="prefill"}'] == MAX_PREFILL // 3
            assert engines_of(router)["engines"][0]["cluster"]["sharing"] == "fallback"
        during = len(statuses)
        wait_for(lambda: len(statuses) >= during + 30)  # still serving without Redis
        redis.start()
        for router in routers:
            wait_for(lambda r=router: all(  # type: ignore[misc]
                not cluster_of(r)["degraded"] and cluster_of(r)["instances"] == 3
                for _ in range(4)), timeout=10)
            assert metrics(router.url)["narwhal_cluster_degraded"] == 0
        back = len(statuses)
        wait_for(lambda: len(statuses) >= back + 20)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    for running, waiting in peaks(sims):
        assert running <= MAX_DECODE and waiting <= MAX_PREFILL, peaks(sims)
    deltas = settled_everywhere(routers, counters)
    assert sum(d.get("narwhal_completed_total", 0) for d in deltas) == len(statuses)
    assert all(d.get("narwhal_cluster_syncs_total{outcome=\"failed\"}", 0) > 0 for d in deltas)


# -- predictive admission across instances ----------------------------------------------------
RATE = 1000  # prefill tokens/s: a 2400-token prompt takes ~2.4 s
BUDGET = 3.0


def post(base: str, tokens: int) -> tuple[int, bytes]:
    body = {"model": chat()["model"], "prompt": "tok " * (tokens - 1), "max_tokens": 4}
    status, _, raw = http(base, "POST", "/v1/completions", body, timeout=30)
    return status, raw


def test_load_through_one_instance_refuses_at_another(tmp_path: Path,
                                                      redis: RedisServer) -> None:
    sim = start_sim("--prefill-tokens-per-s", str(RATE), "--prefill-overhead-ms", "5",
                    "--tpot-ms", "5", "--output-len", "4")
    config = router_config([sim.url], admission={"ttft_budget_s": BUDGET},
                           cluster=cluster_section(redis, "predictive"))
    a = b = None
    try:
        a = start_router(tmp_path, config)
        b = start_router(tmp_path, config)
        for router in (a, b):
            wait_for(lambda r=router: get_json(f"{r.url}/ready") == {"ready": True}  # type: ignore[misc]
                     and cluster_of(r)["instances"] == 2, timeout=20)
        # One instance profiled the engine; the other adopted its profile.
        reasons = sorted(engines_of(r)["engines"][0]["learned"]["profile"]["reason"]
                         for r in (a, b))
        assert reasons == ["join", "shared"], reasons
        status, raw = post(b.url, 1000)  # alone, B admits a 1000-token prompt
        assert status == 200, raw
        first: dict[str, Any] = {}
        url = a.url

        def r1() -> None:
            first["r"] = post(url, 2400)

        thread = threading.Thread(target=r1)
        thread.start()
        try:
            # B learns of A's placed prefill work at its next sync.
            wait_for(lambda: engines_of(b)["engines"][0]["cluster"]["peers"]["prefill_wait_s"]
                     > 1.0, timeout=2)
            assert engines_of(b)["engines"][0]["learned"]["projected"]["prefill_inflight"] == 0
            status, raw = post(b.url, 2400)
            assert status == 429 and b"ttft_budget_exceeded" in raw, raw
        finally:
            thread.join(15)
        assert first["r"][0] == 200
        wait_for(lambda: engines_of(b)["engines"][0]["cluster"]["peers"]["prefill_wait_s"] == 0)
        status, raw = post(b.url, 1000)  # A's work done: B admits again
        assert status == 200, raw
        m = metrics(b.url)
        assert m['narwhal_refused_total{reason="ttft_budget_exceeded"}'] == 1
    finally:
        for proc in (a, b, sim):
            if proc is not None:
                proc.stop()
