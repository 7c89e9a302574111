"""What a placement policy sees and does: order the candidate engines for one request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand

TIE_S = 0.002
"""Projected TTFTs closer than this (or than ``TIE_FRACTION`` of the best) count as equal."""
TIE_FRACTION = 0.02


@dataclass(slots=True)
class Candidate:
    """One eligible engine with room, as the policy sees it for the request at hand."""

    engine: Engine
    ttft_s: float  # projected: prefill work placed ahead on it + this prompt's prefill
    decode_load: float  # expected decode tokens still to come there, divided by its weight
    prefill_inflight: int  # requests in prefill there (every worker process)
    decode_inflight: int  # requests in decode there (every worker process)
    cached_tokens: int = 0  # prompt tokens its prefix cache probably holds (counted out of ttft_s)
    cost_s: float = 0.0  # cache-aware: ttft_s + the decode interference of joining its batch


class Policy(Protocol):
    """A placement policy: a small plug-in chosen by name (``scheduling.policy``)."""

    name: str
    needs_prefix: bool  # placement must compute the request's prompt-prefix key
    cache_aware: bool  # projections count only the tokens an engine's prefix cache lacks

    def order(self, candidates: list[Candidate], demand: Demand) -> list[Candidate]:
        """Candidates best first; placement takes the first whose slot it can acquire."""
        ...

    def placed(self, engine: Engine, demand: Demand) -> None:
        """``demand`` went to ``engine``."""
        ...


def tie_band(candidates: list[Candidate]) -> float:
    """The projected TTFT up to which candidates tie with the best."""
    best = min(c.ttft_s for c in candidates)
    return best + max(TIE_S, TIE_FRACTION * best)
