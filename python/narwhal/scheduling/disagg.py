"""Disaggregated placement: run a request on a mixed engine, or split it into a prefill leg
on a ``role: prefill`` engine and a decode leg on a ``role: decode`` engine.

A split placement holds a prefill slot on the prefill engine (released when the prefill
leg ends) and reserves a decode slot on the decode engine at once (held until the request
ends), so the decode leg never waits for capacity after its KV cache is ready.

The choice between the best mixed engine and the best pair is by projected TTFT when the
learned model can project it (the prefill engine's queued prefill work and prefill model;
the transfer is not modelled), and by requests in prefill per unit of weight otherwise.
The decode engine of a pair is the least loaded one (expected decode tokens per weight).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from narwhal._narwhal_fast import Slot
from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand, Track
from narwhal.scheduling.policies import Candidate

if TYPE_CHECKING:
    from narwhal.scheduling.placement import Placement, Scheduler


@dataclass(slots=True)
class Split:
    """The decode half of a split placement: its engine and the decode slot reserved there."""

    engine: Engine
    slot: Slot | None

    def release(self, scheduler: Scheduler) -> None:
        """Give the reserved decode slot back (idempotent)."""
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()
            scheduler.leave(self.engine, "decode")


def usable(engines: Sequence[Engine]) -> list[Engine]:
    """Serving engines that can take a request's prefill slot: mixed engines, and prefill
    engines while some decode engine serves (decode engines are chosen as partners)."""
    serving = [e for e in engines if e.serves()]
    decoders = any(e.config.role == "decode" for e in serving)
    return [e for e in serving
            if e.config.role == "mixed" or (e.config.role == "prefill" and decoders)]


def decoders(scheduler: Scheduler, exclude: Engine | None = None) -> list[Engine]:
    """Decode engines with a decode slot to come, least expected decode work first."""
    now = time.monotonic()
    learning = scheduler.learning
    found = [e for e in scheduler.engines if e.config.role == "decode" and e.serves()
             and e is not exclude and scheduler.decode_local[e.index] < e.config.max_decode]
    return sorted(found, key=lambda e: (learning.decode_load(e, now) / e.config.weight,
                                        scheduler.decode_local[e.index] / e.config.weight))


def _better_split(scheduler: Scheduler, mixed: Candidate | None, split: Candidate) -> bool:
    if mixed is None:
        return True
    learning = scheduler.learning
    if learning.profiled(mixed.engine) and learning.profiled(split.engine):
        return split.ttft_s < mixed.ttft_s
    weight_m, weight_s = mixed.engine.config.weight, split.engine.config.weight
    return split.prefill_inflight / weight_s < mixed.prefill_inflight / weight_m


def _take_prefill(scheduler: Scheduler, ordered: list[Candidate],
                  demand: Demand) -> tuple[Engine, Slot, Track] | None:
    for choice in ordered:
        engine = choice.engine
        slot = scheduler.board.acquire_slot(engine.index, "prefill", engine.config.max_prefill)
        if slot is not None:
            scheduler.prefill_local[engine.index] += 1
            track = scheduler.learning.place(engine, demand, slot)
            scheduler.policy.placed(engine, demand)
            return engine, slot, track
    return None


def _take_split(scheduler: Scheduler, ordered: list[Candidate],
                demand: Demand) -> Placement | None:
    from narwhal.scheduling.placement import Placement

    for decoder in decoders(scheduler):
        cfg = decoder.config
        slot = scheduler.board.acquire_slot(decoder.index, "decode", cfg.max_decode)
        if slot is None:
            continue
        scheduler.decode_local[decoder.index] += 1
        taken = _take_prefill(scheduler, ordered, demand)
        if taken is None:
            slot.release()
            scheduler.decode_local[decoder.index] -= 1
            return None
        engine, prefill, track = taken
        return Placement(engine, prefill, track, Split(decoder, slot))
    return None


def choose(scheduler: Scheduler, candidates: list[Candidate], demand: Demand) -> Placement | None:
    """Acquire the better of the mixed and split placements, falling back to the other."""
    from narwhal.scheduling.placement import Placement

    policy = scheduler.policy
    mixed = policy.order([c for c in candidates if c.engine.config.role == "mixed"], demand) \
        if any(c.engine.config.role == "mixed" for c in candidates) else []
    prefill = policy.order([c for c in candidates if c.engine.config.role == "prefill"], demand) \
        if any(c.engine.config.role == "prefill" for c in candidates) else []
    split_first = bool(prefill) and _better_split(scheduler, mixed[0] if mixed else None,
                                                  prefill[0])
    for kind in (("split", "mixed") if split_first else ("mixed", "split")):
        if kind == "split" and prefill:
            placement = _take_split(scheduler, prefill, demand)
            if placement is not None:
                return placement
        elif kind == "mixed" and mixed:
            taken = _take_prefill(scheduler, mixed, demand)
            if taken is not None:
                return Placement(*taken)
    return None


def replace_prefill(scheduler: Scheduler, demand: Demand,
                    exclude: Engine) -> tuple[Engine, Slot, Track] | None:
    """Another prefill engine for a failed prefill leg (the decode half is kept)."""
    now = time.monotonic()
    engines = [e for e in scheduler.eligible()
               if e.config.role == "prefill" and e is not exclude]
    if not engines:
        return None
    ordered = scheduler.policy.order([scheduler.candidate(e, demand, now) for e in engines],
                                     demand)
    return _take_prefill(scheduler, ordered, demand)
