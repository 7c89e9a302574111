"""``lowest_ttft``: the lowest projected TTFT wins; decode load breaks ties (SPEC §7)."""

from __future__ import annotations

from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.scheduling.policies.base import TIE_FRACTION, TIE_S, Candidate, tie_band


class LowestTtft:
    """Projected TTFT = prefill work already placed on the engine ÷ its learned rate (with
    overheads) + this prompt's prefill there, counting only the tokens the engine's prefix
    cache probably lacks (``learning/prefix.py``). Engines within a small band of the best
    tie; among them, those within one request's expected output of the least decode work
    prefer the most cached tokens, then the least expected decode work (per unit of weight)
    wins. Load and cache meet in the one projection: a hot prefix stays on its engine until
    queueing there costs more than prefilling it elsewhere. Cache-aware, engines are ranked
    by that TTFT plus the decode interference of joining their batch (learned TPOT growth x
    this request's expected output x requests decoding there, counted for it and for them),
    so affinity never piles a hot prefix onto one engine's decode batch either."""

    name = "lowest_ttft"
    cache_aware = True
    needs_prefix = False

    def order(self, candidates: list[Candidate], demand: Demand) -> list[Candidate]:
        band = tie_band(candidates)
        if demand.probe is None:
            return sorted(candidates, key=lambda c: (c.ttft_s > band,
                                                     c.ttft_s if c.ttft_s > band else 0.0,
                                                     c.decode_load))
        best = min(c.cost_s for c in candidates)
        cost_band = best + max(TIE_S, TIE_FRACTION * best)
        floor = min(c.decode_load for c in candidates if c.cost_s <= cost_band)
        slack = floor + max(1.0, demand.expected_output)

        def key(c: Candidate) -> tuple[bool, float, int, float]:
            tied = c.cost_s <= cost_band
            cached = c.cached_tokens if tied and c.decode_load <= slack else 0
            return (not tied, 0.0 if tied else c.cost_s, -cached, c.decode_load)

        return sorted(candidates, key=key)

    def placed(self, engine: Engine, demand: Demand) -> None:
        pass
