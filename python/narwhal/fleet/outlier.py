"""Outlier ejection: failed request attempts take an engine out, never a whole fleet.

Modelled on Envoy's outlier detection, in two detectors with one cap:

* **Transport** (connect failures, resets, header timeouts, engine 5xx, the engine refusing
  the router's key): ``threshold`` consecutive such failures on one engine eject it.
  Nothing a client sends makes an engine refuse connections, so these count per engine.
* **Content** (malformed output, unsupported fields, the engine's own error event): a
  client can make every engine produce these on purpose, so an engine is ejected for them
  only when it fails clearly more often than its peers over the last ``WINDOW_S`` — enough
  answers on both sides, a failure share well above theirs and several times theirs, and a
  difference no accident of sampling explains. When every engine fails alike, nobody goes.
* **The cap**: ejections never hold out more than ``max_ejected_percent`` of the fleet
  (rounded down), nor the last engine of a role that passes its health probes. An ejection
  over the cap does not happen; it is logged and counted.

An ejection lasts ``base_s`` times the engine's ejection count (at most ``MAX_FACTOR``
times; the count decays by one per ``base_s`` back in service); then the engine is
half-open: one trial attempt decides whether it returns or goes out again for longer.

Each router process (each ``--workers`` worker) keeps its own view.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from narwhal.config import EngineConfig


class Engine(Protocol):
    """What outlier detection reads of an engine (``fleet.engine.Engine``)."""

    @property
    def name(self) -> str: ...

    config: EngineConfig
    breaker: Outlier

    def passes(self) -> bool: ...

log = logging.getLogger("narwhal.outlier")

# -- what the request flow reports, once per attempt ---------------------------------------
TRANSPORT_KINDS = ("connect", "header_timeout", "reset", "status_5xx", "auth_rejected")
"""The engine could not be reached, answered 5xx, or refused the router's own key (401/403):
counted per engine, consecutively."""
CONTENT_KINDS = ("malformed_engine_output", "unsupported_engine_field", "engine_error_event")
"""The engine answered, but the answer failed: judged against the engine's peers."""
FAILURE_KINDS = TRANSPORT_KINDS + CONTENT_KINDS
KINDS = frozenset({"ok", "neutral", *FAILURE_KINDS})
"""``ok``: the engine answered properly (its stream completed, or its own 4xx went to the
client); ``neutral``: the attempt says nothing about the engine (client left, deadline)."""

EJECTION_KINDS = ("transport", "content")

# -- content detector constants (operators tune the cap, not these) -------------------------
WINDOW_S = 30.0  # answers older than this no longer count
BUCKETS = 6  # the window slides in steps of WINDOW_S / BUCKETS
MIN_VOLUME = 10  # answers an engine, and its peers together, need before it is judged
MIN_SHARE = 0.25  # failure share below which an engine is never a content outlier
RATIO = 3.0  # ... and it must fail at least this many times as often as its peers
MARGIN = 0.3  # ... and at least this much more often (in share of answers)
Z = 3.0  # ... and the difference must be this many standard errors (two-proportion test)
MAX_FACTOR = 10  # an ejection lasts at most this many times base_s


def kind_for_code(code: str) -> str:
    """A stream session's failure code (§12 error code) as a failure kind."""
    if code == "engine_error":
        return "engine_error_event"
    if code in CONTENT_KINDS:
        return code
    raise ValueError(f"not a stream failure code: {code!r}")


class EjectionState(enum.Enum):
    CLOSED = "closed"  # in service
    OPEN = "open"  # ejected: no placements until the ejection time ends
    HALF_OPEN = "half_open"  # one trial attempt decides: ok returns it, a failure ejects again


class _Window:
    """Answers and content failures over the last ``WINDOW_S``, in ``BUCKETS`` steps."""

    __slots__ = ("_answers", "_failures", "_slots")

    def __init__(self) -> None:
        self._slots = [-1] * BUCKETS
        self._answers = [0] * BUCKETS
        self._failures = [0] * BUCKETS

    def add(self, now: float, failed: bool) -> None:
        slot = int(now * BUCKETS / WINDOW_S)
        i = slot % BUCKETS
        if self._slots[i] != slot:
            self._slots[i], self._answers[i], self._failures[i] = slot, 0, 0
        self._answers[i] += 1
        self._failures[i] += failed

    def totals(self, now: float) -> tuple[int, int]:
        """(answers, content failures) within the window."""
        oldest = int(now * BUCKETS / WINDOW_S) - BUCKETS
        answers = failures = 0
        for slot, a, f in zip(self._slots, self._answers, self._failures, strict=True):
            if slot > oldest:
                answers += a
                failures += f
        return answers, failures

    def clear(self) -> None:
        self._slots = [-1] * BUCKETS


class Fleet:
    """What the engines' detectors share: settings, the clock, and the fleet for the cap."""

    def __init__(
        self,
        engines: Sequence[Engine] = (),
        *,
        threshold: int = 3,
        base_s: float = 3.0,
        max_ejected_percent: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engines = engines  # the live list: engines added later are seen
        self.threshold = threshold
        self.base_s = base_s
        self.max_ejected_percent = max_ejected_percent
        self.clock = clock

    def cap_allows(self, engine: Engine) -> bool:
        """May ``engine`` be ejected now without breaking the cap?"""
        others = [e for e in self.engines if e is not engine]
        ejected = sum(e.breaker.ejected for e in others)
        if ejected + 1 > (len(others) + 1) * self.max_ejected_percent // 100:
            return False
        if not engine.passes():
            return True  # its probes fail: it is out of placement anyway
        role = engine.config.role
        return any(e.config.role == role and e.passes() and not e.breaker.ejected
                   for e in others)

    def content_outlier(self, engine: Engine, now: float) -> bool:
        """Does ``engine`` fail on content clearly more often than its peers?"""
        n, f = engine.breaker.window.totals(now)
        if n < MIN_VOLUME or f < MIN_SHARE * n:
            return False
        peers_n = peers_f = 0
        for e in self.engines:
            if e is not engine and not e.breaker.ejected:
                a, b = e.breaker.window.totals(now)
                peers_n += a
                peers_f += b
        if peers_n < MIN_VOLUME:
            return False
        share, peers = f / n, peers_f / peers_n
        if share < RATIO * peers or share - peers < MARGIN:
            return False
        pooled = (f + peers_f) / (n + peers_n)
        spread = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / peers_n))
        return spread == 0 or (share - peers) / spread >= Z


_LONE = Fleet()


class Outlier:
    """One engine's attempt record and ejection state (``engine.breaker``).

    closed → (ejected) → open → (its ejection time) → half-open → (trial ok) → closed, or
    (trial failed) → open again, for longer. A half-open trial whose verdict never comes
    holds the trial only for ``base_s``, so a lost verdict cannot keep an engine out.
    """

    __slots__ = (
        "_capped",
        "_returned_at",
        "_timer",
        "_trial_since",
        "attempts",
        "capped",
        "consecutive",
        "ejected_at",
        "ejected_for",
        "ejected_total",
        "ejections",
        "engine",
        "failures",
        "fleet",
        "kind",
        "name",
        "on_change",
        "state",
        "window",
    )

    def __init__(self, name: str):
        self.name = name
        self.fleet = _LONE  # until the health monitor joins it to its fleet
        self.engine: Engine | None = None
        self.on_change: Callable[[], None] | None = None
        self.state = EjectionState.CLOSED
        self.kind: str | None = None  # "transport" or "content" while ejected
        self.consecutive = 0  # transport failures in a row
        self.ejections = 0  # the ejection-time multiplier
        self.ejected_at = 0.0
        self.ejected_for = 0.0
        self.window = _Window()
        self.attempts = 0
        self.failures = dict.fromkeys(FAILURE_KINDS, 0)
        self.ejected_total = dict.fromkeys(EJECTION_KINDS, 0)
        self.capped = dict.fromkeys(EJECTION_KINDS, 0)  # ejections the cap prevented
        self._capped = False  # the current episode was counted in ``capped`` already
        self._returned_at: float | None = None
        self._trial_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def join(self, fleet: Fleet, engine: Engine, on_change: Callable[[], None]) -> None:
        """Take part in ``fleet``'s detection (the health monitor calls this)."""
        self.fleet = fleet
        self.engine = engine
        self.on_change = on_change

    @property
    def ejected(self) -> bool:
        """Out of service (open, or half-open awaiting its trial): counts toward the cap."""
        return self.state is not EjectionState.CLOSED

    # -- placement side --------------------------------------------------------------------
    def allows(self) -> bool:
        """May a new request be placed on this engine? (Not consuming: :meth:`begin` takes
        the half-open trial.)"""
        state = self.state
        if state is EjectionState.CLOSED:
            return True
        now = self.fleet.clock()
        if state is EjectionState.OPEN:
            if now - self.ejected_at < self.ejected_for:
                return False
            self._set(EjectionState.HALF_OPEN, notify=False)  # the timer notifies
        trial = self._trial_since
        return trial is None or now - trial >= self.fleet.base_s

    def begin(self) -> None:
        """An attempt is being dispatched to this engine (takes the half-open trial)."""
        if self.state is not EjectionState.CLOSED and self.allows():
            self._trial_since = self.fleet.clock()

    # -- verdicts --------------------------------------------------------------------------
    def record(self, kind: str) -> None:
        """One attempt's verdict: ``ok``, ``neutral`` or one of :data:`FAILURE_KINDS`."""
        if kind not in KINDS:
            raise ValueError(f"unknown attempt verdict {kind!r}; known: {sorted(KINDS)}")
        self.attempts += 1
        state = self.state
        if kind == "neutral":
            if state is EjectionState.HALF_OPEN:
                self._trial_since = None  # no verdict: let another trial go
            return
        now = self.fleet.clock()
        if kind == "ok":
            self.consecutive = 0
            self._capped = False
            self.window.add(now, False)
            if state is EjectionState.HALF_OPEN:
                self._return(now)
            return
        self.failures[kind] += 1
        transport = kind in TRANSPORT_KINDS
        if transport:
            self.consecutive += 1
        else:
            self.window.add(now, True)
        if state is EjectionState.OPEN:
            return  # a late verdict of an attempt dispatched before the ejection
        if state is EjectionState.HALF_OPEN:
            if transport or self.kind == "content":
                self._eject("transport" if transport else "content", now, why="its trial failed")
            else:
                self._return(now)  # out for transport, and it answered: content is judged apart
            return
        if transport and self.consecutive >= self.fleet.threshold:
            self._try_eject("transport", now, f"{self.consecutive} consecutive {kind} failures")
        elif not transport and self.engine is not None and self.fleet.content_outlier(
            self.engine, now
        ):
            n, f = self.window.totals(now)
            self._try_eject("content", now, f"{f} of its {n} answers failed, clearly more "
                                            "than its peers'")

    # -- reporting -------------------------------------------------------------------------
    def describe(self) -> str:
        """``closed``, ``open`` or ``half_open``."""
        if self.state is EjectionState.OPEN:
            self.allows()  # an elapsed ejection shows as half-open
        return self.state.value

    def snapshot(self) -> dict[str, Any]:
        """The ejection state for ``/engines``."""
        state = self.describe()
        now = self.fleet.clock()
        n, f = self.window.totals(now)
        left = self.ejected_at + self.ejected_for - now if state == "open" else 0.0
        return {
            "state": state,
            "kind": self.kind,
            "remaining_s": round(max(0.0, left), 3),
            "ejections": dict(self.ejected_total),
            "capped": dict(self.capped),
            "consecutive_failures": self.consecutive,
            "window": {"answers": n, "content_failures": f, "seconds": WINDOW_S},
        }

    # -- internals -------------------------------------------------------------------------
    def _try_eject(self, kind: str, now: float, why: str) -> None:
        if self.engine is not None and self.fleet.cap_allows(self.engine):
            self._eject(kind, now, why)
            return
        if not self._capped:
            self._capped = True
            self.capped[kind] += 1
            log.warning("engine %s: not ejected (%s): health.max_ejected_percent=%d, or it is "
                        "the last engine of its role passing its probes", self.name, why,
                        self.fleet.max_ejected_percent)

    def _eject(self, kind: str, now: float, why: str) -> None:
        base = self.fleet.base_s
        if self._returned_at is not None:  # one step of decay per base_s back in service
            self.ejections = max(0, self.ejections - int((now - self._returned_at) / base))
            self._returned_at = None
        self.ejections = min(self.ejections + 1, MAX_FACTOR)
        self.ejected_for = base * self.ejections
        self.ejected_at = now
        self.kind = kind
        self.ejected_total[kind] += 1
        self._capped = False
        log.warning("engine %s: ejected (%s) for %.3gs: %s", self.name, kind, self.ejected_for,
                    why)
        self._set(EjectionState.OPEN)
        self._arm(self.ejected_for)

    def _return(self, now: float) -> None:
        log.info("engine %s: back in service after a good trial", self.name)
        self.kind = None
        self.consecutive = 0
        self._returned_at = now
        self.window.clear()  # judged afresh on what it does from now on
        self._set(EjectionState.CLOSED)

    def _set(self, state: EjectionState, *, notify: bool = True) -> None:
        self.state = state
        self._trial_since = None
        if state is EjectionState.CLOSED and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if notify and self.on_change is not None:
            self.on_change()

    def _arm(self, delay: float) -> None:
        """Wake placement when the ejection ends (queued requests wait on a kick, not a poll)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._elapsed)

    def _elapsed(self) -> None:
        self._timer = None
        left = self.ejected_for - (self.fleet.clock() - self.ejected_at)
        if self.state is EjectionState.OPEN and left > 0:
            self._arm(left + 0.001)  # the timer fired a little early
            return
        if self.state is not EjectionState.CLOSED and self.on_change is not None:
            self.allows()
            self.on_change()  # half-open: the trial may be placed now


# -- /metrics -------------------------------------------------------------------------------
def metric_families(engines: Sequence[Engine]) -> list[Metric]:
    """Per-engine attempts, failures by kind, ejections by kind (this process's view)."""
    attempts = CounterMetricFamily(
        "narwhal_engine_attempts", "Request attempts dispatched to the engine, with a verdict.",
        labels=["engine"])
    failures = CounterMetricFamily(
        "narwhal_engine_attempt_failures", "Failed request attempts of the engine, by kind.",
        labels=["engine", "reason"])
    ejections = CounterMetricFamily(
        "narwhal_engine_ejections", "Outlier ejections of the engine, by detector.",
        labels=["engine", "kind"])
    capped = CounterMetricFamily(
        "narwhal_engine_ejections_capped",
        "Ejections not made because of health.max_ejected_percent or the last placeable "
        "engine, by detector.", labels=["engine", "kind"])
    ejected = GaugeMetricFamily(
        "narwhal_engine_ejected", "1 while the engine is ejected (open or half-open).",
        labels=["engine"])
    for engine in engines:
        o = engine.breaker
        attempts.add_metric([engine.name], o.attempts)
        for reason in FAILURE_KINDS:
            failures.add_metric([engine.name, reason], o.failures[reason])
        for kind in EJECTION_KINDS:
            ejections.add_metric([engine.name, kind], o.ejected_total[kind])
            capped.add_metric([engine.name, kind], o.capped[kind])
        ejected.add_metric([engine.name], float(o.ejected))
    return [attempts, failures, ejections, capped, ejected]
