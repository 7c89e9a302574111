"""``lowest_ttft``: the lowest projected TTFT wins; decode load breaks ties (SPEC §7)."""

from __future__ import annotations

from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.scheduling.policies.base import Candidate, tie_band


class LowestTtft:
    """Projected TTFT = prefill work already placed on the engine ÷ its learned rate (with
    overheads) + this prompt's prefill there. Engines within a small band of the best tie,
    and among them the least expected decode work (per unit of weight) wins."""

    name = "lowest_ttft"
    needs_prefix = False

    def order(self, candidates: list[Candidate], demand: Demand) -> list[Candidate]:
        band = tie_band(candidates)
        return sorted(candidates, key=lambda c: (c.ttft_s > band,
                                                 c.ttft_s if c.ttft_s > band else 0.0,
                                                 c.decode_load))

    def placed(self, engine: Engine, demand: Demand) -> None:
        pass
