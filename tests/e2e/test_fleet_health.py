"""Health probing end to end: eviction and restore of a real engine process, and monitoring
degradation when probes hang (a proxy that accepts and never answers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fleet_support import (
    Counters,
    FaultProxy,
    assert_refused,
    complete,
    engines,
    fleet_config,
    ready,
    sim_received,
    start_sim_on,
    wait_for,
)
from procs import Proc, free_port, http, metrics, start_router

pytestmark = pytest.mark.timeout(90)

INTERVAL = 0.2


def _health(**extra: float) -> dict[str, float]:
    # A 1 s probe timeout: an engine a loaded host answers late is not failed (a stopped one
    # is refused at once, and the time a hanging probe takes is asserted on nowhere).
    return {"interval_s": INTERVAL, "timeout_s": 1.0, "failures_to_evict": 3,
            "successes_to_restore": 2, "monitoring_stale_s": 5.0, **extra}


def listed(sim: Proc) -> int:
    """Good probes the simulator has answered (each reads GET /v1/models before it counts)."""
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return int(json.loads(raw)["models_listed"])


def test_stopped_engine_is_evicted_then_restored(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    sims = [start_sim_on(p) for p in ports]
    router = start_router(tmp_path, fleet_config([s.url for s in sims], health=_health()))
    try:
        # Both engines were unknown at start and are healthy after their first good probe,
        # which Narwhal waits for before it prints its ready line.
        assert ready(router.url) == (200, {"ready": True})
        assert {n: e["state"] for n, e in engines(router.url).items()} == {
            "e0": "healthy", "e1": "healthy"}
        counters = Counters(router.url)

        stopped = time.monotonic()  # before the stop: no probe of e0 fails earlier
        sims[0].stop()
        wait_for(lambda: engines(router.url)["e0"]["state"] == "unhealthy", timeout=10)
        took = time.monotonic() - stopped
        # Three failed probes, a probe every 0.2 s: not before the third one.
        assert took >= (3 - 1) * INTERVAL * 0.8, took
        assert metrics(router.url)['narwhal_engine_up{engine="e0"}'] == 0
        # Traffic goes to the survivor only.
        before = sim_received(sims[1])
        for _ in range(4):
            assert complete(router.url)[0] == 200
        assert sim_received(sims[1]) == before + 4

        # With no engine left: 503 backend_unavailable, /ready no_eligible_engines.
        sims[1].stop()
        wait_for(lambda: engines(router.url)["e1"]["state"] == "unhealthy", timeout=10)
        assert ready(router.url) == (503, {"ready": False, "reason": "no_eligible_engines"})
        assert_refused(complete(router.url), 503, "backend_unavailable")

        # Restart e0 where the router expects it: back after two good probes.
        sims[0] = start_sim_on(ports[0])
        wait_for(lambda: engines(router.url)["e0"]["state"] == "healthy", timeout=10)
        assert listed(sims[0]) >= 2  # the new process had answered two probes
        assert ready(router.url) == (200, {"ready": True})
        assert metrics(router.url)['narwhal_engine_up{engine="e0"}'] == 1
        before = sim_received(sims[0])
        assert complete(router.url)[0] == 200
        assert sim_received(sims[0]) == before + 1

        delta = counters.settled()
        assert delta["narwhal_offered_total"] == 6
        assert delta["narwhal_completed_total"] == 5
        assert delta['narwhal_rejected_total{reason="backend_unavailable"}'] == 1
    finally:
        router.stop()
        for s in sims:
            s.stop()


def test_hanging_probes_make_the_router_monitoring_degraded_until_they_answer(
    tmp_path: Path,
) -> None:
    sim = start_sim_on(0)
    proxy = FaultProxy(int(sim.url.rsplit(":", 1)[1]))
    stale = 2.0
    config = fleet_config([proxy.url], health=_health(monitoring_stale_s=stale))
    router = start_router(tmp_path, config)
    try:
        assert ready(router.url) == (200, {"ready": True})
        counters = Counters(router.url)

        hung = time.monotonic()  # before the switch: later probes cannot establish a state
        proxy.mode = "hang"  # the only engine: every probe times out, nothing is established
        wait_for(lambda: ready(router.url)[1].get("reason") == "monitoring_degraded",
                 timeout=10, every=0.02)
        took = time.monotonic() - hung
        # Staleness counts from the last probe that answered, up to a round (0.2 s, longer
        # if the router stalled) before the hang; the first probe timed out ~1.2 s in at most.
        assert stale - 0.6 <= took <= stale + 3.0, took
        assert ready(router.url) == (503, {"ready": False, "reason": "monitoring_degraded"})
        refused = complete(router.url)
        assert_refused(refused, 503, "monitoring_degraded")
        assert refused[1]["content-type"] == "application/json"

        proxy.mode = "pass"  # probes answer again: the state clears by itself
        wait_for(lambda: ready(router.url)[0] == 200, timeout=10)
        wait_for(lambda: engines(router.url)["e0"]["state"] == "healthy", timeout=10)
        assert complete(router.url)[0] == 200

        delta = counters.settled()
        assert delta["narwhal_offered_total"] == 2
        assert delta['narwhal_rejected_total{reason="monitoring_degraded"}'] == 1
        assert delta["narwhal_completed_total"] == 1
    finally:
        router.stop()
        proxy.close()
        sim.stop()
