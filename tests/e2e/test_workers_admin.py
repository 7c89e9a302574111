"""Admin changes reach every worker of a ``--workers N`` router, whichever worker took them."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_support import ADMIN_ENV, ADMIN_SECTION, admin, fleet_config, ready, wait_for
from procs import start_router, start_sim

pytestmark = pytest.mark.timeout(60)

ASKS = 24  # fresh connections spread over the workers by SO_REUSEPORT


def _reasons(base: str) -> set[str | None]:
    return {ready(base)[1].get("reason") for _ in range(ASKS)}


def test_maintenance_drain_and_role_reach_every_worker(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "2")
    router = None
    try:
        cfg = fleet_config([sim.url], admin=ADMIN_SECTION)
        router = start_router(tmp_path, cfg, "--workers", "2", env=ADMIN_ENV)
        base = router.url
        assert wait_for(lambda: _reasons(base) == {None})

        status, _, _ = admin(base, "/admin/maintenance", {"waves": ["*"], "enabled": True})
        assert status == 200
        assert wait_for(lambda: _reasons(base) == {"maintenance"}, timeout=5)

        admin(base, "/admin/maintenance", {"waves": ["*"], "enabled": False})
        assert wait_for(lambda: _reasons(base) == {None}, timeout=5)

        admin(base, "/admin/engines/e0/drain", {"enabled": True})
        assert wait_for(lambda: _reasons(base) == {"no_eligible_engines"}, timeout=5)
        admin(base, "/admin/engines/e0/drain", {"enabled": False})

        admin(base, "/admin/role", {"role": "standby"})
        assert wait_for(lambda: _reasons(base) == {"standby"}, timeout=5)
        admin(base, "/admin/role", {"role": "active"})
        assert wait_for(lambda: _reasons(base) == {None}, timeout=5)
    finally:
        if router is not None:
            router.stop()
        sim.stop()
