"""The Rust accounting board against its pure-Python oracle, over random operation sequences."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from narwhal._narwhal_fast import Board, Slot, Ticket

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference.board_oracle import (
    BARE_CLASSES,
    BOUNDS,
    PHASES,
    REASON_CLASSES,
    REASONS,
    BoardOracle,
    OracleSlot,
    OracleTicket,
)

ENGINES = 3
limits = st.integers(min_value=0, max_value=4)
picks = st.integers(min_value=0, max_value=1_000)
classes = st.sampled_from((*REASON_CLASSES, *BARE_CLASSES, "lost"))
reasons = st.one_of(st.none(), st.sampled_from((*REASONS, "oops")))
histogram_values = st.one_of(
    st.sampled_from(sorted({b for bounds in BOUNDS.values() for b in bounds})),
    st.floats(min_value=-1.0, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from((float("nan"), float("inf"))),
)


def same_outcome(rust: Any, oracle: Any) -> Any:
    """Runs both; they must both raise ValueError or both return the same value."""
    results = []
    for call in (rust, oracle):
        try:
            results.append(("ok", call()))
        except ValueError:
            results.append(("error", None))
    assert results[0][0] == results[1][0], results
    return results


class BoardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.board = Board(engines=ENGINES)
        self.oracle = BoardOracle(engines=ENGINES)
        self.tickets: list[tuple[Ticket, OracleTicket]] = []
        self.slots: list[tuple[Slot, OracleSlot]] = []

    @rule(limit=limits)
    def arrive(self, limit: int) -> None:
        ticket, admitted = self.board.arrive(limit)
        twin, twin_admitted = self.oracle.arrive(limit)
        assert admitted == twin_admitted == ticket.admitted
        self.tickets.append((ticket, twin))

    @precondition(lambda self: self.tickets)
    @rule(pick=picks, tokens=st.integers(min_value=0, max_value=10_000))
    def sized(self, pick: int, tokens: int) -> None:
        ticket, twin = self.tickets[pick % len(self.tickets)]
        ticket.sized(tokens)
        twin.sized(tokens)

    @precondition(lambda self: self.tickets)
    @rule(pick=picks, limit=limits)
    def enqueue(self, pick: int, limit: int) -> None:
        ticket, twin = self.tickets[pick % len(self.tickets)]
        assert ticket.enqueue(limit) == twin.enqueue(limit)
        assert ticket.queued == twin.queued

    @precondition(lambda self: self.tickets)
    @rule(pick=picks)
    def dequeue(self, pick: int) -> None:
        ticket, twin = self.tickets[pick % len(self.tickets)]
        ticket.dequeue()
        twin.dequeue()

    @precondition(lambda self: self.tickets)
    @rule(pick=picks, cls=classes, reason=reasons)
    def finish(self, pick: int, cls: str, reason: str | None) -> None:
        ticket, twin = self.tickets[pick % len(self.tickets)]
        results = same_outcome(lambda: ticket.finish(cls, reason), lambda: twin.finish(cls, reason))
        assert results[0] == results[1]
        assert ticket.finished == twin.finished

    @precondition(lambda self: self.tickets)
    @rule(pick=picks)
    def drop_ticket(self, pick: int) -> None:
        _, twin = self.tickets.pop(pick % len(self.tickets))
        twin.drop()  # the Rust ticket's last reference went with the pop: its Drop ran

    @rule(
        engine=st.integers(min_value=0, max_value=ENGINES),
        phase=st.sampled_from((*PHASES, "x")),
        limit=limits,
        total=st.none() | limits,
    )
    def acquire(self, engine: int, phase: str, limit: int, total: int | None) -> None:
        results = same_outcome(
            lambda: self.board.acquire_slot(engine, phase, limit, total),
            lambda: self.oracle.acquire_slot(engine, phase, limit, total),
        )
        if 0 <= engine < ENGINES:
            assert self.board.inflight(engine) == self.oracle.inflight_of(engine)
        assert self.board.queued() == self.oracle.queued_now()
        slot, twin = results[0][1], results[1][1]
        assert (slot is None) == (twin is None)
        if slot is not None:
            assert (slot.engine, slot.phase) == (engine, phase)
            self.slots.append((slot, twin))

    @precondition(lambda self: self.slots)
    @rule(pick=picks)
    def release(self, pick: int) -> None:
        slot, twin = self.slots[pick % len(self.slots)]
        assert slot.release() == twin.release()
        assert slot.released == twin.released

    @precondition(lambda self: self.slots)
    @rule(pick=picks)
    def drop_slot(self, pick: int) -> None:
        _, twin = self.slots.pop(pick % len(self.slots))
        twin.drop()

    @rule(engine=st.integers(min_value=0, max_value=ENGINES), up=st.booleans())
    def set_up(self, engine: int, up: bool) -> None:
        same_outcome(
            lambda: self.board.set_engine_up(engine, up),
            lambda: self.oracle.set_engine_up(engine, up),
        )

    @rule(name=st.sampled_from((*BOUNDS, "latency")), value=histogram_values)
    def observe(self, name: str, value: float) -> None:
        same_outcome(
            lambda: self.board.observe(name, value), lambda: self.oracle.observe(name, value)
        )

    @invariant()
    def snapshots_agree(self) -> None:
        snap = self.board.snapshot()
        assert snap == self.oracle.snapshot()
        finished = snap["cancelled"] + snap["completed"]
        finished += sum(sum(snap[cls].values()) for cls in REASON_CLASSES)
        assert snap["offered"] == finished + snap["retained"]

    def teardown(self) -> None:
        self.tickets.clear()
        self.slots.clear()
        snap = self.board.snapshot()
        assert snap["retained"] == snap["queued"] == snap["retention_held"] == 0
        assert all(e["prefill"] == e["decode"] == 0 for e in snap["engines"])


BoardMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_board_matches_oracle = BoardMachine.TestCase
