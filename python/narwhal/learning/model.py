"""The learned latency model of the fleet: what the relay reports, what admission and placement ask.

Per engine: a prefill model (overhead + tokens / rate) from profiling, a TPOT model scored
on every decode attempt, drift scores of both, and the engine's projected load (prefill
work placed on it, decode occupancy). Per model (or adapter) and route: the output-length
distribution. The
supervisor (``supervisor.py``) profiles engines when they join and when drift says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from narwhal._narwhal_fast import Slot
from narwhal.fleet.engine import Engine
from narwhal.learning.drift import Drift
from narwhal.learning.latency import DEFAULT_PREFILL, PrefillModel
from narwhal.learning.learned import EngineLearned
from narwhal.learning.occupancy import Demand, PendingBook, Track
from narwhal.learning.output_length import OutputLengths, Table
from narwhal.learning.prefix import PrefixCaches
from narwhal.learning.supervisor import Supervisor
from narwhal.learning.tpot import attempt_tpot
from narwhal.request.models import Served

if TYPE_CHECKING:
    from narwhal.config import Config

PENDING_BOOKS = 1024
"""Models' and adapters' pending books kept before the idle ones are dropped."""
MIN_TPOT_TOKENS = 3
"""A decode attempt is scored for TPOT when at least this many tokens followed its first read."""


def state_file(config: Config | None, shared_path: str | None) -> str | None:
    """Where learned state is kept: ``state_file`` when configured; else, with several
    workers, a scratch file beside the shared board (``shared_path``), so a profile one
    worker made is adopted by the others rather than made again by each (every worker
    profiling every engine would load the engines N times and keep an added engine joining
    until the last worker's turn); else nowhere."""
    if config is not None and config.state_file is not None:
        return config.state_file
    return None if shared_path is None else f"{shared_path}.learned.json"


class Learning:
    """Receives measurements from the relay and answers projections."""

    def __init__(self, engines: Sequence[Engine], config: Config | None = None, *,
                 shared_path: str | None = None) -> None:
        """``shared_path``: a file every worker process opens (the shared board's), to take
        turns profiling; None in a single process."""
        self.engines = engines
        self.config = config
        self.predictive = config is not None and config.admission.mode == "predictive"
        self.drift_threshold = config.admission.drift_threshold if config is not None else 0.5
        # Per engine, by board slot (engines come and go at run time: add_engine, remove_engine).
        self.learned: dict[int, EngineLearned] = {e.index: EngineLearned(e) for e in engines}
        self.output = OutputLengths()
        self.pending = PendingBook()
        self.pendings: dict[Served, PendingBook] = {}  # other models' and adapters'
        self.on_profiled: Callable[[Engine], None] | None = None
        self.prefix: PrefixCaches | None = None  # cache-aware projection (prefix.py)
        if config is not None and config.scheduling.prefix_cache:
            self.prefix = PrefixCaches(engines, config.scheduling.prefix_chunk_bytes)
        self.supervisor = Supervisor(
            self.learned, self.output, self._profiled,
            model=config.default_model if config is not None else "",
            state_file=state_file(config, shared_path), shared_path=shared_path)

    def _profiled(self, engine: Engine) -> None:
        if self.on_profiled is not None:
            self.on_profiled(engine)

    # -- what placement and admission ask ---------------------------------------------------
    def profiled(self, engine: Engine) -> bool:
        return self.learned[engine.index].prefill is not None

    def prefill_model(self, engine: Engine) -> PrefillModel:
        """The engine's learned prefill model; before its profile, the fleet's mean or a prior."""
        own = self.learned[engine.index].prefill
        if own is not None:
            return own
        known = [e.prefill for e in self.learned.values() if e.prefill is not None]
        if not known:
            return DEFAULT_PREFILL
        return PrefillModel(sum(m.overhead_s for m in known) / len(known),
                            sum(m.tokens_per_s for m in known) / len(known))

    def prefill_wait(self, engine: Engine, now: float) -> float:
        """Seconds until the prefill work already placed on ``engine`` is done."""
        return self.learned[engine.index].load.prefill_wait(now)

    def decode_load(self, engine: Engine, now: float) -> float:
        """Expected output tokens still to come on ``engine`` (decode correction applied)."""
        return self.learned[engine.index].load.decode_load(now, self._expected)

    def decoding(self, engine: Engine) -> int:
        return self.learned[engine.index].load.decoding()

    def expected_output(self, demand: Demand, generated: int = 0) -> float:
        """Expected output length of a request, given what it has generated so far."""
        return self.lengths(demand.served)[demand.route].expected(demand.max_tokens, generated)

    def _expected(self, track: Track) -> float:
        demand = track.demand
        return self.lengths(demand.served)[demand.route].expected(demand.max_tokens,
                                                                  track.tokens)

    def lengths(self, served: Served | None) -> Table:
        """The output-length distributions of a model or adapter, by route (the first
        configured model's are the default; an adapter's start from its base model's)."""
        if served is None or (served.index == 0 and served.base is served):
            return self.output.routes
        like = self.lengths(served.base) if served.base is not served else None
        return self.output.for_model(served.name, like)

    def pending_for(self, served: Served | None) -> PendingBook:
        """The admission queue's waiting work for a model or adapter (the first configured
        model's is ``pending``)."""
        if served is None or (served.index == 0 and served.base is served):
            return self.pending
        book = self.pendings.get(served)
        if book is None:
            if len(self.pendings) >= PENDING_BOOKS:  # adapters come and go: drop idle books
                self.pendings = {s: b for s, b in self.pendings.items() if b.count}
            book = self.pendings[served] = PendingBook()
        return book

    # -- hooks: placement and the relay -----------------------------------------------------
    def place(self, engine: Engine, demand: Demand, slot: Slot | None, *,
              prefill: bool = True) -> Track:
        """``demand`` was placed on ``engine``: its prefill joins the engine's chain.
        ``prefill=False``: a disaggregated decode leg (its prefill ran elsewhere)."""
        now = time.monotonic()
        load = self.learned[engine.index].load
        uncached = self.uncached_tokens(engine, demand)
        cost = self.prefill_model(engine).seconds(uncached) if prefill else 0.0
        track = Track(demand, engine.index, slot, now, cost, load.prefill_wait(now) + cost)
        track.cached_tokens = demand.prompt_tokens - uncached
        load.place(track)
        self.pending.discard(demand)
        if self.prefix is not None and demand.probe is not None and prefill:
            self.prefix.placed(engine.index, demand)
        return track

    def uncached_tokens(self, engine: Engine, demand: Demand) -> int:
        """The prompt tokens ``engine`` must prefill: those its prefix cache probably lacks."""
        if demand.probe is None:
            return demand.prompt_tokens
        return demand.prompt_tokens - PrefixCaches.cached_tokens(demand, engine.index)

    def on_first_token(self, track: Track, now_loop: float) -> None:
        """The attempt's first generated token (``now_loop``: the relay's loop time)."""
        if track.released or track.first_at is not None:
            return
        learned = self.learned.get(track.engine)
        if learned is None:
            return  # its engine left the fleet
        now = time.monotonic()
        track.first_loop = now_loop
        track.first_tokens = track.tokens
        learned.load.first_token(track, now, self._expected(track))
        if learned.prefill is None:
            return
        observed = now - track.placed_at
        learned.last_prefill = (track.predicted_prefill_s, observed)
        if track.cached_tokens:
            return  # a wrong cache estimate is the prefix index's to correct, not a drift
        learned.drift_ttft.observe(observed, track.predicted_prefill_s)
        self._check_drift(learned, learned.drift_ttft, "drift_ttft")

    def release(self, track: Track) -> None:
        """The attempt is over (however it ended): out of the engine's projected load."""
        learned = self.learned.get(track.engine)
        if learned is not None:  # None: its engine left the fleet
            learned.load.release(track, time.monotonic())

    def on_end(self, track: Track, last_loop: float, completed: bool) -> None:
        """The request ended; ``last_loop``: the relay's loop time of its last token read."""
        self.release(track)
        learned = self.learned.get(track.engine)
        if track.first_at is None or learned is None:
            return
        demand = track.demand
        if completed:
            self.lengths(demand.served)[demand.route].observe(demand.max_tokens, track.tokens)
            self.supervisor.dirty = True
        if track.tokens - track.first_tokens < MIN_TPOT_TOKENS:
            return
        tpot = attempt_tpot(track.first_loop, last_loop, track.tokens, track.first_tokens)
        if tpot is None:
            return
        predicted = learned.tpot.predict(track.batch)
        if predicted is not None and learned.prefill is not None:
            learned.drift_tpot.observe(tpot, predicted)
            self._check_drift(learned, learned.drift_tpot, "drift_tpot")
        learned.tpot.observe(tpot, track.batch)
        self.supervisor.dirty = True

    def _check_drift(self, learned: EngineLearned, drift: Drift, kind: str) -> None:
        """Sustained drift makes a re-profile due (run no sooner than
        ``REPROFILE_MIN_INTERVAL_S`` after the last profile)."""
        if learned.due is None and not learned.profiling and drift.exceeds(self.drift_threshold):
            learned.due = kind
            learned.wanted_at = time.time()
            self.supervisor.wake()

    def add_engine(self, engine: Engine) -> None:
        """``engine`` joined the fleet (its slot is free here): learn it from scratch, or from
        the state file when it holds a profile of the same name and URL."""
        learned = self.learned[engine.index] = EngineLearned(engine)
        self.supervisor.added(learned)
        if self.prefix is not None:
            self.prefix.add_engine(engine)
        self.supervisor.wake()

    def remove_engine(self, engine: Engine) -> None:
        """``engine`` left the fleet and nothing is in flight on it: forget it (its slot may
        go to another engine)."""
        learned = self.learned.get(engine.index)
        if learned is not None and learned.engine is engine:
            del self.learned[engine.index]
            self.supervisor.removed(learned)
            if self.prefix is not None:
                self.prefix.remove_engine(engine)

    def reconfigure(self, config: Config) -> None:
        """New settings, live: the drift threshold."""
        self.config = config
        self.drift_threshold = config.admission.drift_threshold

    def engine_changed(self, engine: Engine) -> None:
        """The engine's health or drain state changed: it may need its first profile."""
        self.supervisor.wake()

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Start profiling; in predictive mode, wait (bounded) for the first profiles."""
        await self.supervisor.start(wait=self.predictive)

    async def stop(self) -> None:
        await self.supervisor.stop()

    # -- reporting --------------------------------------------------------------------------
    def describe(self, engine: Engine) -> dict[str, Any] | None:
        """The ``learned`` object of ``/engines`` (SI units)."""
        learned = self.learned.get(engine.index)
        if learned is None or learned.engine is not engine:
            return None
        now = time.monotonic()
        prefill = learned.prefill
        last = learned.last_prefill
        return {
            "prefill_tokens_per_s": _round(prefill.tokens_per_s) if prefill else None,
            "prefill_overhead_s": _round(prefill.overhead_s) if prefill else None,
            "tpot_s": _round(learned.tpot.base_s),
            "tpot_growth_s": _round(learned.tpot.growth_s),
            "drift_ttft": round(learned.drift_ttft.value, 4),
            "drift_tpot": round(learned.drift_tpot.value, 4),
            "output_length": self.output.describe(),
            "profiled_at": learned.profiled_at,
            "profile": {
                "count": learned.profiles,
                "reason": learned.profile_reason,
                "running": learned.profiling,
                "due": learned.due,
                "failures": learned.failures,
                "error": learned.error,
            },
            "projected": {
                "prefill_wait_s": _round(learned.load.prefill_wait(now)),
                "prefill_inflight": learned.load.prefill_inflight(),
                "decoding": learned.load.decoding(),
                "decode_tokens": round(learned.load.decode_load(now, self._expected), 1),
            },
            "last_prefill": None if last is None else {
                "predicted_s": _round(last[0]), "observed_s": _round(last[1])},
        }

    def metric_families(self) -> Iterator[Metric]:
        """Learned gauges for ``/metrics`` (``BoardCollector``'s ``extra``)."""
        drift = GaugeMetricFamily(
            "narwhal_engine_drift",
            "Relative error of the engine's observed TTFT (prefill part) or TPOT against "
            "its learned model, as an EWMA (0 = perfect).", labels=["engine", "kind"])
        rate = GaugeMetricFamily("narwhal_engine_learned_prefill_tokens_per_second",
                                 "Learned prefill rate.", labels=["engine"])
        overhead = GaugeMetricFamily("narwhal_engine_learned_prefill_overhead_seconds",
                                     "Learned fixed prefill overhead.", labels=["engine"])
        tpot = GaugeMetricFamily("narwhal_engine_learned_tpot_seconds",
                                 "Learned time per output token of a lone request.",
                                 labels=["engine"])
        profiles = CounterMetricFamily("narwhal_engine_profiles",
                                       "Finished profiles of the engine, by outcome.",
                                       labels=["engine", "outcome"])
        for learned in self.learned.values():
            name = learned.engine.name
            drift.add_metric([name, "ttft"], learned.drift_ttft.value)
            drift.add_metric([name, "tpot"], learned.drift_tpot.value)
            if learned.prefill is not None:
                rate.add_metric([name], learned.prefill.tokens_per_s)
                overhead.add_metric([name], learned.prefill.overhead_s)
            if learned.tpot.base_s is not None:
                tpot.add_metric([name], learned.tpot.base_s)
            profiles.add_metric([name, "ok"], learned.outcomes[0])
            profiles.add_metric([name, "failed"], learned.outcomes[1])
        yield from (drift, rate, overhead, tpot, profiles)


def _round(value: float | None) -> float | None:
    if value is None:
        return None
    return float(f"{value:.6g}")
