"""Placement: which engine runs a request, holding a prefill slot on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from narwhal._narwhal_fast import Board, Slot
from narwhal.fleet.engine import Engine


@dataclass(slots=True)
class Placement:
    engine: Engine
    prefill: Slot


class Scheduler:
    """Least-loaded placement over placement-eligible engines.

    Eligible: healthy, not draining, not in maintenance, a role that can run the whole
    request. Among those with a free prefill slot (and decode capacity to come), the engine
    with the least prefill work in flight wins, then the least decode load; ties rotate.
    Slot limits are enforced by the shared board, so they hold across worker processes.
    """

    def __init__(self, engines: Sequence[Engine], board: Board):
        self.engines = engines
        self.board = board
        self._turn = 0
        # Per-worker view of in-flight work, for ranking only (limits live in the board).
        self.prefill_local = [0] * len(engines)
        self.decode_local = [0] * len(engines)

    def eligible(self) -> list[Engine]:
        return [e for e in self.engines if e.serves() and e.config.role == "mixed"]

    def try_place(self, exclude: Engine | None = None) -> Placement | None:
        candidates = [e for e in self.eligible() if e is not exclude]
        if not candidates:
            return None
        self._turn = (self._turn + 1) % len(candidates)
        rotated = candidates[self._turn :] + candidates[: self._turn]
        rotated.sort(key=lambda e: (self.prefill_local[e.index], self.decode_local[e.index]))
        for engine in rotated:
            cfg = engine.config
            if self.prefill_local[engine.index] + self.decode_local[engine.index] >= cfg.max_decode:
                continue  # no decode slot to come on this engine
            slot = self.board.acquire_slot(engine.index, "prefill", cfg.max_prefill)
            if slot is not None:
                self.prefill_local[engine.index] += 1
                return Placement(engine, slot)
        return None

    def enter_decode(self, engine: Engine) -> Slot | None:
        """Move one request of ``engine`` from prefill to decode (its decode slot was reserved
        at placement, so the limit here also admits the prefill work that reserved it)."""
        self.prefill_local[engine.index] -= 1
        self.decode_local[engine.index] += 1
        cfg = engine.config
        return self.board.acquire_slot(engine.index, "decode", cfg.max_decode + cfg.max_prefill)

    def leave(self, engine: Engine, phase: str) -> None:
        if phase == "prefill":
            self.prefill_local[engine.index] -= 1
        else:
            self.decode_local[engine.index] -= 1
