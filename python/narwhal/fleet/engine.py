"""One engine as the router sees it: its configuration, connection pool, health, drain and
ejection state."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from narwhal.fleet.outlier import Outlier
from narwhal.upstream.client import EngineClient

if TYPE_CHECKING:
    from narwhal.config import EngineConfig

# Dialects whose streams carry per-event token IDs when asked with return_token_ids.
TOKEN_ID_DIALECTS = frozenset({"vllm"})


class Health(enum.Enum):
    UNKNOWN = "unknown"  # no probe answered yet
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Engine:
    """An engine of the fleet. ``index`` is its slot in the shared accounting board, kept for
    the engine's life (an engine added at run time takes a free slot; a removed one gives its
    slot back once nothing is in flight on it in any worker).

    ``joining``: added at run time and not yet profiled (its first good probe and profile
    come before its first placement). ``removed``: taken out of the fleet; its in-flight
    requests finish, nothing new is placed on it.
    """

    __slots__ = (
        "breaker",
        "client",
        "config",
        "consecutive_failures",
        "consecutive_successes",
        "draining",
        "health",
        "index",
        "joining",
        "load",
        "maintenance",
        "model",
        "removed",
    )

    def __init__(self, index: int, config: EngineConfig, client: EngineClient,
                 model: str = ""):
        self.index = index
        self.config = config
        self.client = client
        self.model = model  # the model the router's own requests name (profiling probes)
        self.health = Health.UNKNOWN
        self.draining = False
        self.maintenance = False
        self.joining = False
        self.removed = False
        self.consecutive_failures = 0
        self.consecutive_successes = 0
        self.load: dict[str, float] = {}
        self.breaker = Outlier(config.name)  # joined to its fleet by the health monitor

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def token_ids(self) -> bool:
        """Does this engine return validated token IDs (token_accounting: token_ids)?"""
        return self.config.dialect in TOKEN_ID_DIALECTS

    @property
    def token_accounting(self) -> str:
        return "token_ids" if self.token_ids else "unavailable"

    @property
    def state(self) -> str:
        if self.removed:
            return "removing"
        if self.joining:
            return "joining"
        if self.maintenance:
            return "maintenance"
        if self.draining:
            return "draining"
        if self.health is Health.HEALTHY and self.breaker.describe() == "open":
            return "circuit_open"
        return self.health.value

    def passes(self) -> bool:
        """Healthy (passing its probes), not drained, not in maintenance, in the fleet and
        done joining: placeable unless outlier ejection holds it out."""
        return (self.health is Health.HEALTHY and not self.draining and not self.maintenance
                and not self.joining and not self.removed)

    def serves(self) -> bool:
        """Placeable and not ejected: accepting new placements (phase capacity is checked by
        the scheduler)."""
        return self.passes() and self.breaker.allows()

    def describe(self, inflight: dict[str, int], models: list[str] | None = None
                 ) -> dict[str, Any]:
        """The engine on ``/engines``; ``models``: the names it can serve now."""
        cfg = self.config
        return {
            "name": cfg.name,
            "url": cfg.url,
            "models": models,
            "dialect": cfg.dialect,
            "role": cfg.role,
            "wave": cfg.wave,
            "state": self.state,
            "health": self.health.value,
            "breaker": self.breaker.describe(),
            "attempts": self.breaker.attempts,
            "failures": dict(self.breaker.failures),
            "ejection": self.breaker.snapshot(),
            "token_accounting": self.token_accounting,
            "inflight": inflight,
            "max_prefill": cfg.max_prefill,
            "max_decode": cfg.max_decode,
            "load": self.load,
            "learned": None,
        }
