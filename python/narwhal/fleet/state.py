"""Router state: HA role and lease, maintenance waves, monitoring staleness → refusal code."""

from __future__ import annotations

from collections.abc import Sequence

from narwhal.config import Config
from narwhal.fleet.engine import Engine
from narwhal.fleet.health import HealthMonitor


class RouterState:
    """Decides whether the router may serve completions at all (SPEC §4, last row)."""

    def __init__(self, config: Config, engines: Sequence[Engine], health: HealthMonitor):
        self.config = config
        self.engines = engines
        self.health = health

    def refusal(self) -> str | None:
        """The refusal code in force (router_standby, router_fenced, maintenance,
        monitoring_degraded), or None when the router serves."""
        return None

    async def start(self) -> None:
        """Start background work (lease renewal)."""

    async def stop(self) -> None:
        """Stop background work and give up the lease."""
