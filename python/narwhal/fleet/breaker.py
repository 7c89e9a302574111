"""Per-engine circuit breaker: consecutive failed attempts take an engine out for a cool-down."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

log = logging.getLogger("narwhal.breaker")

# Attempt endings that say the engine itself misbehaved (SPEC §6: failing attempts count
# against the engine). `unsupported_engine_field` is the request's content, not the engine's
# health; deadlines and cancellations say nothing about the engine either way.
ENGINE_FAULTS = frozenset({"engine_error", "malformed_engine_output"})


class BreakerState(enum.Enum):
    CLOSED = "closed"  # traffic flows; consecutive failures are counted
    OPEN = "open"  # no placements until the cool-down ends
    HALF_OPEN = "half_open"  # one trial request decides: success closes, failure reopens


def judge(cls: str, reason: str | None) -> bool | None:
    """An attempt's terminal (class, reason) as a verdict on the engine: True good, False bad,
    None no verdict (the client went away, the deadline passed, the content was unsupported)."""
    if cls == "completed" or (cls == "invalid_requests" and reason == "engine_rejected"):
        return True
    if reason in ENGINE_FAULTS:
        return False
    return None


class Breaker:
    """closed → (``threshold`` consecutive failures) → open → (``cooldown_s``) → half-open →
    (one trial: success) → closed, or (failure) → open again.

    A half-open trial whose verdict never comes (a stream abandoned without an outcome) holds
    the trial only for one cool-down, so a lost verdict cannot keep an engine out for good.
    """

    __slots__ = (
        "_clock",
        "_failures",
        "_opened_at",
        "_timer",
        "_trial_since",
        "cooldown_s",
        "name",
        "on_change",
        "state",
        "threshold",
    )

    def __init__(
        self,
        name: str,
        *,
        threshold: int = 3,
        cooldown_s: float = 3.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.on_change = on_change
        self.state = BreakerState.CLOSED
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._trial_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- placement side --------------------------------------------------------------------
    def allows(self) -> bool:
        """May a new request be placed on this engine? (Not consuming: the trial is taken by
        :meth:`begin`.)"""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        now = self._clock()
        if state is BreakerState.OPEN:
            if now - self._opened_at < self.cooldown_s:
                return False
            self._set(BreakerState.HALF_OPEN, notify=False)  # the timer notifies
        trial = self._trial_since
        return trial is None or now - trial >= self.cooldown_s

    def begin(self) -> None:
        """An attempt is being dispatched to this engine (takes the half-open trial)."""
        if self.state is not BreakerState.CLOSED and self.allows():
            self._trial_since = self._clock()

    # -- verdicts --------------------------------------------------------------------------
    def record(self, ok: bool | None) -> None:
        """One attempt's verdict (see :func:`judge`)."""
        state = self.state
        if ok is None:
            if state is BreakerState.HALF_OPEN:
                self._trial_since = None  # no verdict: let another trial go
            return
        if ok:
            self._failures = 0
            if state is not BreakerState.CLOSED:
                log.info("engine %s: circuit closed after a good trial", self.name)
                self._set(BreakerState.CLOSED)
            return
        self._failures += 1
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and self._failures >= self.threshold
        ):
            log.warning(
                "engine %s: circuit open for %.3gs after %d failed attempt(s)",
                self.name, self.cooldown_s, self._failures,
            )
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)
            self._arm()

    def describe(self) -> str:
        """``closed``, ``open`` or ``half_open`` (for ``/engines``)."""
        if self.state is BreakerState.OPEN:
            self.allows()  # an elapsed cool-down shows as half-open
        return self.state.value

    # -- internals -------------------------------------------------------------------------
    def _set(self, state: BreakerState, *, notify: bool = True) -> None:
        self.state = state
        self._trial_since = None
        if state is BreakerState.CLOSED and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if notify and self.on_change is not None:
            self.on_change()

    def _arm(self, delay: float | None = None) -> None:
        """Wake placement when the cool-down ends (queued requests wait on a kick, not a poll)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.cooldown_s if delay is None else delay, self._cooled)

    def _cooled(self) -> None:
        self._timer = None
        left = self.cooldown_s - (self._clock() - self._opened_at)
        if self.state is not BreakerState.CLOSED and left > 0:
            self._arm(left + 0.001)  # the timer fired a little early
            return
        if self.state is not BreakerState.CLOSED and self.on_change is not None:
            self.allows()
            self.on_change()  # half-open: the trial may be placed now
