"""Circuit breaker: closed → open → half-open → closed/open, driven by a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from narwhal.fleet.breaker import Breaker, BreakerState, judge


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(threshold: int = 3, cooldown: float = 2.0) -> tuple[Breaker, Clock, list[str]]:
    clock = Clock()
    changes: list[str] = []
    breaker = Breaker("e0", threshold=threshold, cooldown_s=cooldown, clock=clock)
    breaker.on_change = lambda: changes.append(breaker.state.value)
    return breaker, clock, changes


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    b, _, changes = make()
    b.record(False)
    b.record(False)
    b.record(True)  # not consecutive
    b.record(False)
    b.record(False)
    assert b.state is BreakerState.CLOSED and b.allows()
    b.record(False)
    assert b.state is BreakerState.OPEN and not b.allows()
    assert changes == ["open"]


def test_no_verdict_counts_for_nothing() -> None:
    b, _, _ = make(threshold=1)
    for _ in range(5):
        b.record(None)
    assert b.state is BreakerState.CLOSED


def test_cooldown_then_one_trial_that_closes_it() -> None:
    b, clock, changes = make(threshold=1, cooldown=2.0)
    b.record(False)
    clock.now += 1.9
    assert not b.allows()
    clock.now += 0.2
    assert b.allows() and b.state is BreakerState.HALF_OPEN
    assert b.describe() == "half_open"
    b.begin()  # the trial goes out
    assert not b.allows()  # nobody else until its verdict
    b.record(True)
    assert b.state is BreakerState.CLOSED and b.allows()
    assert changes == ["open", "closed"]


def test_failed_trial_reopens_for_another_cooldown() -> None:
    b, clock, _ = make(threshold=2, cooldown=1.0)
    b.record(False)
    b.record(False)
    clock.now += 1.0
    assert b.allows()
    b.begin()
    b.record(False)
    assert b.state is BreakerState.OPEN and not b.allows()
    clock.now += 1.0
    assert b.allows()


def test_trial_without_verdict_frees_the_trial() -> None:
    b, clock, _ = make(threshold=1, cooldown=1.0)
    b.record(False)
    clock.now += 1.0
    b.begin()
    assert not b.allows()
    b.record(None)  # the client went away: no verdict
    assert b.allows()
    b.begin()
    clock.now += 1.0  # a lost verdict holds the trial for one cool-down only
    assert b.allows()


def test_begin_outside_half_open_does_nothing() -> None:
    b, _, _ = make()
    b.begin()
    assert b.allows()


@pytest.mark.parametrize(
    ("cls", "reason", "verdict"),
    [("completed", None, True), ("invalid_requests", "engine_rejected", True),
     ("failed", "engine_error", False), ("failed", "malformed_engine_output", False),
     ("failed", "unsupported_engine_field", None), ("expired", "deadline_expired", None),
     ("cancelled", None, None), ("rejected", "queue_full", None)],
)
def test_judge(cls: str, reason: str | None, verdict: bool | None) -> None:
    assert judge(cls, reason) is verdict


def test_cooldown_end_wakes_placement() -> None:
    async def run() -> list[str]:
        b = Breaker("e0", threshold=1, cooldown_s=0.05)
        seen: list[str] = []
        b.on_change = lambda: seen.append(b.state.value)
        b.record(False)
        await asyncio.sleep(0.15)
        return seen

    assert asyncio.run(run()) == ["open", "half_open"]
