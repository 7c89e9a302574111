"""Router state: HA role and lease, maintenance waves, monitoring staleness → refusal code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from narwhal.config import Config
from narwhal.fleet.engine import Engine
from narwhal.fleet.ha import Role, make_role
from narwhal.fleet.health import HealthMonitor
from narwhal.fleet.maintenance import Maintenance


class RouterState:
    """Decides whether the router may serve completions at all (SPEC §4, last row).

    Precedence when several hold: HA (standby, fenced) first — another instance should get
    the traffic — then whole-wave maintenance, then monitoring-degraded.
    """

    def __init__(
        self,
        config: Config,
        engines: Sequence[Engine],
        health: HealthMonitor,
        on_change: Callable[[Engine], None] | None = None,
    ):
        self.config = config
        self.engines = engines
        self.health = health
        self.ha: Role = make_role(config.ha.role, config.ha.lease)
        self.maintenance = Maintenance(engines, on_change or health.on_change)
        self._stepping_down: asyncio.Task[None] | None = None

    def refusal(self) -> str | None:
        """The refusal code in force (router_standby, router_fenced, maintenance,
        monitoring_degraded), or None when the router serves. Cheap: called per request."""
        code = self.ha.refusal()
        if code is not None:
            return code
        if self.maintenance.whole:
            return "maintenance"
        if self.health.degraded():
            return "monitoring_degraded"
        return None

    def describe(self) -> dict[str, Any]:
        """Everything an operator wants to see about the router's own state."""
        return {
            "refusal": self.refusal(),
            "ha": self.ha.describe(),
            "maintenance": self.maintenance.describe(),
            "monitoring": {
                "staleness_s": round(self.health.staleness(), 3),
                "stale_after_s": self.config.health.monitoring_stale_s,
                "degraded": self.health.degraded(),
                "rounds": self.health.rounds,
            },
        }

    async def start(self) -> None:
        """Start background work (lease renewal)."""
        await self.ha.start()

    def step_down(self) -> None:
        """Shutting down: give up the lease now (in-flight requests still finish here)."""
        if self._stepping_down is None:
            self._stepping_down = asyncio.get_running_loop().create_task(self.ha.stop())

    async def stop(self) -> None:
        """Stop background work and give up the lease."""
        if self._stepping_down is not None:
            await self._stepping_down
        await self.ha.stop()
