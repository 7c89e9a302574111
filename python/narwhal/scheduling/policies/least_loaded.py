"""``least_loaded``: fewest requests in prefill, then in decode (per unit of weight)."""

from __future__ import annotations

from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.scheduling.policies.base import Candidate


class LeastLoaded:
    """Counts requests, ignoring the learned model: the behaviour before learning."""

    name = "least_loaded"
    cache_aware = False
    needs_prefix = False

    def order(self, candidates: list[Candidate], demand: Demand) -> list[Candidate]:
        return sorted(candidates, key=lambda c: (c.prefill_inflight / c.engine.config.weight,
                                                 c.decode_inflight / c.engine.config.weight))

    def placed(self, engine: Engine, demand: Demand) -> None:
        pass
