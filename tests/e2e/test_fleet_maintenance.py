"""Admin routes end to end: bearer token, maintenance waves, engine drain and the HA role,
each checked on the answer, `/ready`, `/engines` and the counters."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import (
    ADMIN_ENV,
    ADMIN_SECTION,
    TOKEN,
    Counters,
    admin,
    assert_refused,
    chat,
    complete,
    engines,
    envelope,
    fleet_config,
    http,
    ready,
    sim_received,
    start_sim_on,
    wait_for,
)
from procs import Proc, start_router

pytestmark = pytest.mark.timeout(120)


class Fleet:
    def __init__(self, tmp: Path, **sections: Any):
        # Slow decode on e0 so a long request is still in flight when its wave is drained.
        self.sims = [start_sim_on(0, "--tpot-ms", "10"), start_sim_on(0)]
        engines_cfg = [{"name": "e0", "url": self.sims[0].url, "wave": "a"},
                       {"name": "e1", "url": self.sims[1].url, "wave": "b"}]
        config = fleet_config([], engines=engines_cfg, admin=ADMIN_SECTION, **sections)
        self.router: Proc = start_router(tmp, config, env=ADMIN_ENV)
        self.url = self.router.url

    def close(self) -> None:
        self.router.stop()
        for s in self.sims:
            s.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("maint"))
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "fleet" in request.fixturenames:
        f: Fleet = request.getfixturevalue("fleet")
        admin(f.url, "/admin/maintenance", {"waves": ["*"], "enabled": False})
        for name in ("e0", "e1"):
            admin(f.url, f"/admin/engines/{name}/drain", {"enabled": False})
        admin(f.url, "/admin/role", {"role": "active"})


# -- the token ------------------------------------------------------------------------------
def test_admin_routes_are_absent_without_a_configured_token(tmp_path: Path) -> None:
    sim = start_sim_on(0)
    router = start_router(tmp_path, fleet_config([sim.url]))  # no admin section
    try:
        for path in ("/admin/maintenance", "/admin/role", "/admin/engines/e0/drain",
                     "/admin/state", "/admin/nope"):
            status, headers, body = admin(router.url, path, {"waves": ["*"], "enabled": True})
            assert status == 404 and body["error"]["code"] == "not_found"
            assert "www-authenticate" not in headers
        assert ready(router.url) == (200, {"ready": True})  # nothing was changed
    finally:
        router.stop()
        sim.stop()


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer", TOKEN,
                                  f"Bearer {TOKEN}x"])
def test_missing_or_wrong_token_is_401(fleet: Fleet, auth: str | None) -> None:
    headers = {} if auth is None else {"authorization": auth}
    for path in ("/admin/maintenance", "/admin/nope"):
        status, hdrs, raw = http(fleet.url, "POST", path, {"waves": ["*"], "enabled": True},
                                 headers)
        assert status == 401 and hdrs["www-authenticate"] == "Bearer"
        assert envelope(raw)["code"] == "unauthorized"
    assert ready(fleet.url) == (200, {"ready": True})


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/admin/maintenance", b"{not json", 400, "invalid_json", None),
        ("/admin/maintenance", b"[]", 400, "invalid_request", None),
        ("/admin/maintenance", {"enabled": True}, 400, "invalid_request", "waves"),
        ("/admin/maintenance", {"waves": [], "enabled": True}, 400, "invalid_request", "waves"),
        ("/admin/maintenance", {"waves": ["a", 3], "enabled": True}, 400, "invalid_request",
         "waves[1]"),
        ("/admin/maintenance", {"waves": ["a", "zz"], "enabled": True}, 400, "invalid_request",
         "waves[1]"),
        ("/admin/maintenance", {"waves": ["a"], "enabled": "yes"}, 400, "invalid_request",
         "enabled"),
        ("/admin/maintenance", {"waves": ["a"]}, 400, "invalid_request", "enabled"),
        ("/admin/engines/e0/drain", {"enabled": 1}, 400, "invalid_request", "enabled"),
        ("/admin/engines/nope/drain", {"enabled": True}, 404, "not_found", None),
        ("/admin/role", {"role": "leader"}, 400, "invalid_request", "role"),
        ("/admin/nope", {}, 404, "not_found", None),
    ],
)
def test_bad_admin_requests_get_the_envelope(
    fleet: Fleet, path: str, body: Any, status: int, code: str, param: str | None
) -> None:
    got, _, answer = admin(fleet.url, path, body)
    assert got == status, answer
    assert answer["error"]["code"] == code and answer["error"]["param"] == param
    assert ready(fleet.url) == (200, {"ready": True})


def test_wrong_method_is_405(fleet: Fleet) -> None:
    status, headers, body = admin(fleet.url, "/admin/maintenance", method="GET")
    assert status == 405 and headers["allow"] == "POST"
    assert body["error"]["code"] == "method_not_allowed"
    status, _, state = admin(fleet.url, "/admin/state", method="GET")
    assert status == 200 and state["ha"]["role"] == "active" and state["refusal"] is None


# -- waves ----------------------------------------------------------------------------------
def test_one_wave_drains_while_its_inflight_request_finishes(fleet: Fleet) -> None:
    counters = Counters(fleet.url)
    # A long request in flight on e0 (make e1 unavailable for the moment so it lands there).
    admin(fleet.url, "/admin/engines/e1/drain", {"enabled": True})
    result: dict[str, Any] = {}
    body = chat(stream=True, max_tokens=60)  # ~0.6 s at 10 ms per token
    worker = threading.Thread(target=lambda: result.update(resp=complete(fleet.url, body)))
    worker.start()
    wait_for(lambda: engines(fleet.url)["e0"]["inflight"]["decode"] == 1, timeout=5, every=0.01)
    admin(fleet.url, "/admin/engines/e1/drain", {"enabled": False})

    status, _, answer = admin(fleet.url, "/admin/maintenance", {"waves": ["a"], "enabled": True})
    assert status == 200
    assert answer["maintenance"] == {"waves": ["a"], "whole": False, "draining": []}
    view = engines(fleet.url)
    assert view["e0"]["state"] == "maintenance" and view["e1"]["state"] == "healthy"
    assert ready(fleet.url) == (200, {"ready": True})  # e1 still serves
    before = sim_received(fleet.sims[0])
    for _ in range(4):
        assert complete(fleet.url)[0] == 200
    assert sim_received(fleet.sims[0]) == before  # no new placement on the drained wave
    worker.join(20)
    status, _, raw = result["resp"]
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw

    admin(fleet.url, "/admin/maintenance", {"waves": ["a"], "enabled": False})
    assert engines(fleet.url)["e0"]["state"] == "healthy"
    delta = counters.settled()
    assert delta["narwhal_offered_total"] == delta["narwhal_completed_total"] == 5


@pytest.mark.parametrize("waves", [["*"], ["a", "b"]])
def test_whole_wave_maintenance_refuses_then_clears(fleet: Fleet, waves: list[str]) -> None:
    counters = Counters(fleet.url)
    status, _, answer = admin(fleet.url, "/admin/maintenance", {"waves": waves, "enabled": True})
    assert status == 200 and answer["maintenance"]["whole"] is True
    assert ready(fleet.url) == (503, {"ready": False, "reason": "maintenance"})
    assert {e["state"] for e in engines(fleet.url).values()} == {"maintenance"}
    assert_refused(complete(fleet.url), 503, "maintenance")
    assert_refused(http(fleet.url, "POST", "/v1/completions",
                        {"model": "m", "prompt": "x"}), 503, "maintenance")
    admin(fleet.url, "/admin/maintenance", {"waves": ["*"], "enabled": False})
    assert ready(fleet.url) == (200, {"ready": True})
    assert complete(fleet.url)[0] == 200
    delta = counters.settled()
    assert delta['narwhal_rejected_total{reason="maintenance"}'] == 2
    assert delta["narwhal_offered_total"] == 3 and delta["narwhal_completed_total"] == 1


def test_drain_one_engine(fleet: Fleet) -> None:
    status, _, answer = admin(fleet.url, "/admin/engines/e1/drain", {"enabled": True})
    assert status == 200 and answer == {"engine": "e1", "draining": True, "state": "draining"}
    assert engines(fleet.url)["e1"]["state"] == "draining"
    before = sim_received(fleet.sims[1])
    for _ in range(3):
        assert complete(fleet.url)[0] == 200
    assert sim_received(fleet.sims[1]) == before
    # Both drained: no eligible engine (not whole-wave maintenance).
    admin(fleet.url, "/admin/engines/e0/drain", {"enabled": True})
    assert ready(fleet.url) == (503, {"ready": False, "reason": "no_eligible_engines"})
    assert_refused(complete(fleet.url), 503, "backend_unavailable")
    admin(fleet.url, "/admin/engines/e0/drain", {"enabled": False})
    admin(fleet.url, "/admin/engines/e1/drain", {"enabled": False})
    assert ready(fleet.url) == (200, {"ready": True})


# -- HA role without a lease backend ----------------------------------------------------------
def test_role_switch_to_standby_and_back(fleet: Fleet) -> None:
    counters = Counters(fleet.url)
    status, _, answer = admin(fleet.url, "/admin/role", {"role": "standby"})
    assert status == 200 and answer == {"ha": {"role": "standby", "lease": None}}
    assert ready(fleet.url) == (503, {"ready": False, "reason": "standby"})
    refused = complete(fleet.url)
    assert_refused(refused, 503, "router_standby")
    assert envelope(refused[2])["type"] == "capacity_error"
    # Standby wins over maintenance in what /ready reports.
    admin(fleet.url, "/admin/maintenance", {"waves": ["*"], "enabled": True})
    assert ready(fleet.url)[1]["reason"] == "standby"
    admin(fleet.url, "/admin/maintenance", {"waves": ["*"], "enabled": False})
    admin(fleet.url, "/admin/role", {"role": "active"})
    assert ready(fleet.url) == (200, {"ready": True})
    assert complete(fleet.url)[0] == 200
    delta = counters.settled()
    assert delta['narwhal_rejected_total{reason="router_standby"}'] == 1
    assert delta["narwhal_offered_total"] == 2


def test_configured_standby_starts_refusing(tmp_path: Path) -> None:
    sim = start_sim_on(0)
    router = start_router(tmp_path, fleet_config([sim.url], ha={"role": "standby"},
                                                  admin=ADMIN_SECTION), env=ADMIN_ENV)
    try:
        assert ready(router.url) == (503, {"ready": False, "reason": "standby"})
        assert_refused(complete(router.url), 503, "router_standby")
        assert admin(router.url, "/admin/role", {"role": "active"})[0] == 200
        assert complete(router.url)[0] == 200
        _, _, raw = http(router.url, "GET", "/metrics")
        assert 'narwhal_rejected_total{reason="router_standby"} 1.0' in raw.decode()
        assert json.loads(http(router.url, "GET", "/ready")[2]) == {"ready": True}
    finally:
        router.stop()
        sim.stop()
