"""What a placement holds on the fleet: the engine's phase slots (Rust guards) and the learned
model's track of the attempt. One object per attempt owns them; releasing it is idempotent."""

from __future__ import annotations

from narwhal._narwhal_fast import Board, Slot
from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Track


class Split:
    """The decode half of a disaggregated placement: its engine and the decode slot reserved
    there at placement (held until the request ends, so the decode leg never waits)."""

    __slots__ = ("engine", "slot")

    def __init__(self, engine: Engine, slot: Slot | None) -> None:
        self.engine = engine
        self.slot = slot

    def release(self) -> None:
        """Give the reserved decode slot back (idempotent)."""
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()


class Placement:
    """One attempt's hold on ``engine``.

    A mixed engine's placement holds a prefill slot, taken only while the engine's requests
    in both phases stay under its ``max_decode`` (so the decode slot it takes at the first
    token is always there, across every worker process: the board checks both limits under
    one lock). A split placement also holds the decode engine's reserved slot (``split``).
    """

    __slots__ = ("_board", "decode", "engine", "prefill", "split", "track")

    def __init__(self, board: Board, engine: Engine, prefill: Slot | None, track: Track,
                 split: Split | None = None, decode: Slot | None = None) -> None:
        self._board = board
        self.engine = engine
        self.prefill = prefill
        self.decode = decode
        self.track = track
        self.split = split

    @property
    def in_prefill(self) -> bool:
        return self.prefill is not None

    def enter_decode(self) -> None:
        """The engine produced the first token: take its decode slot, then give the prefill
        slot back (in that order, so no other placement can take the room in between)."""
        prefill, self.prefill = self.prefill, None
        if prefill is None:
            return
        engine = self.engine
        self.decode = self._board.acquire_slot(engine.index, "decode", engine.config.max_decode)
        prefill.release()

    def release(self) -> bool:
        """Give back every slot still held (idempotent). True when one was held."""
        held = False
        for slot in (self.prefill, self.decode):
            if slot is not None:
                held = slot.release() or held
        self.prefill = self.decode = None
        if self.split is not None:
            held = self.split.slot is not None or held
            self.split.release()
        return held
