"""Health probing: each engine's /health (and load from /metrics, served names from
/v1/models) on a fixed interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import orjson

from narwhal.fleet.engine import Engine, Health
from narwhal.fleet.outlier import Fleet
from narwhal.request.models import Card, parse_cards
from narwhal.tasks import stop_task
from narwhal.upstream.client import UpstreamError

if TYPE_CHECKING:
    from narwhal.config import Health as HealthConfig

log = logging.getLogger("narwhal.health")

_LOAD_RE = re.compile(
    rb"^(vllm:num_requests_running|vllm:num_requests_waiting|sglang:num_running_reqs|"
    rb"sglang:num_queue_reqs)(?:\{[^}]*\})?\s+([0-9.eE+-]+)",
    re.MULTILINE,
)
# Probe failures that still establish the engine's state: it answered, or its host refused
# or reset the connection. Only a probe that hears nothing ("timeout") leaves it unknown.
_KNOWN_FAILURES = frozenset({"connect", "reset", "protocol"})
STOP_WAIT_S = 1.0
"""How long stopping waits for each health task after cancelling it."""


class HealthMonitor:
    """Probes every engine; evicts after ``failures_to_evict``, restores after
    ``successes_to_restore`` (an engine still unknown at start is healthy on its first good
    probe, unhealthy on its first bad one). An engine that answers (any status) or refuses the
    connection has a known state; a probe that times out leaves it unknown, and when no
    probe has established any engine's state for ``monitoring_stale_s`` the router is
    monitoring-degraded. Staleness is measured from the last probe that established a state,
    so a monitoring loop that stalls (not only probes that hang) also counts.

    It also joins the engines' outlier detection into one fleet (:mod:`narwhal.fleet.outlier`):
    ``failures_to_evict`` consecutive transport failures eject an engine, for a base time of
    ``failures_to_evict * interval_s`` (about the time probing takes to evict a dead engine),
    and at most ``max_ejected_percent`` of the engines are ejected at once.
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        config: HealthConfig,
        on_change: Callable[[Engine], None],
        on_models: Callable[[Engine, list[Card]], None] | None = None,
    ):
        self.engines = engines
        self.config = config
        self.on_change = on_change
        self.on_models = on_models  # what a passing engine's GET /v1/models lists
        self.last_established: float | None = None  # loop time a probe last gave a known state
        self.since: float | None = None  # loop time monitoring began (staleness before any state)
        self.rounds = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._extra: set[asyncio.Task[None]] = set()  # probes outside the rounds
        self._stopping = False
        self.outliers = Fleet(
            engines,
            threshold=config.failures_to_evict,
            base_s=config.failures_to_evict * config.interval_s,
            max_ejected_percent=config.max_ejected_percent,
        )
        for engine in engines:
            self.adopt(engine)

    def adopt(self, engine: Engine) -> None:
        """Join ``engine`` to the fleet's outlier detection (an engine added to the live
        list later needs this too)."""
        engine.breaker.join(self.outliers, engine, self._notifier(engine))

    def reconfigure(self, config: HealthConfig) -> None:
        """New health settings, live: the next probe round and ejection use them."""
        self.config = config
        outliers = self.outliers
        outliers.threshold = config.failures_to_evict
        outliers.base_s = config.failures_to_evict * config.interval_s
        outliers.max_ejected_percent = config.max_ejected_percent

    def _notifier(self, engine: Engine) -> Callable[[], None]:
        def notify() -> None:
            self.on_change(engine)

        return notify

    # -- monitoring staleness ---------------------------------------------------------------
    def staleness(self) -> float:
        """Seconds since a probe last established any engine's state (0 before monitoring)."""
        loop = self._loop
        if loop is None:
            return 0.0
        anchor = self.last_established if self.last_established is not None else self.since
        return 0.0 if anchor is None else max(0.0, loop.time() - anchor)

    def degraded(self) -> bool:
        """Monitoring-degraded: no engine's state established for ``monitoring_stale_s``."""
        return self.staleness() > self.config.monitoring_stale_s

    # -- probing ----------------------------------------------------------------------------
    async def probe_all(self) -> None:
        """One probe round over every engine, bounded by about twice ``timeout_s``."""
        loop = self._loop = asyncio.get_running_loop()
        if self.since is None:
            self.since = loop.time()
        limit = 2 * self.config.timeout_s + 0.5  # probe plus load scrape, each bounded
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(self._probe(engine) for engine in self.engines)), limit
            )
        self.rounds += 1

    def probe_soon(self, engine: Engine) -> None:
        """Probe one engine now (an engine that just joined), outside the rounds."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._probe(engine), name=f"probe {engine.name}")
        self._extra.add(task)
        task.add_done_callback(self._extra.discard)

    async def _probe(self, engine: Engine) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        ok = False
        try:
            status, _, _ = await engine.client.fetch("GET", "/health", timeout_s=cfg.timeout_s)
            ok = status == 200
            self.last_established = loop.time()
        except UpstreamError as exc:
            if exc.kind in _KNOWN_FAILURES:
                self.last_established = loop.time()
        except asyncio.CancelledError:
            raise
        except Exception:  # a probe must never kill the monitor
            log.exception("probe of %s failed", engine.name)
        if ok:
            reads = [self._read_models(engine)] if self.on_models is not None else []
            if engine.token_ids:
                reads.append(self._scrape_load(engine))
            if reads:
                await asyncio.gather(*reads, return_exceptions=True)
        self._record(engine, ok)

    async def _read_models(self, engine: Engine) -> None:
        """The engine's served names (adapters come and go with them)."""
        status, _, body = await engine.client.fetch(
            "GET", "/v1/models", timeout_s=self.config.timeout_s
        )
        cards = parse_cards(orjson.loads(body)) if status == 200 else None
        if cards is not None and self.on_models is not None:
            self.on_models(engine, cards)

    async def _scrape_load(self, engine: Engine) -> None:
        status, _, body = await engine.client.fetch(
            "GET", "/metrics", timeout_s=self.config.timeout_s
        )
        if status != 200:
            return
        load: dict[str, float] = {}
        for name, value in _LOAD_RE.findall(body):
            key = name.decode().split(":", 1)[1]
            load[key] = load.get(key, 0.0) + float(value)
        engine.load = load

    def _record(self, engine: Engine, ok: bool) -> None:
        cfg = self.config
        before = engine.health
        if ok:
            engine.consecutive_failures = 0
            engine.consecutive_successes += 1
            if before is Health.UNKNOWN or (
                before is Health.UNHEALTHY
                and engine.consecutive_successes >= cfg.successes_to_restore
            ):
                engine.health = Health.HEALTHY
        else:
            engine.consecutive_successes = 0
            engine.consecutive_failures += 1
            if before is not Health.UNHEALTHY and (
                before is Health.UNKNOWN or engine.consecutive_failures >= cfg.failures_to_evict
            ):
                engine.health = Health.UNHEALTHY
        if engine.health is not before:
            log.warning("engine %s: %s -> %s", engine.name, before.value, engine.health.value)
            self.on_change(engine)

    # -- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        """Probe rounds at a fixed rate: a round starts every ``interval_s`` (or at once when
        the previous round overran it)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.config.interval_s
        while not self._stopping:  # also ends a loop whose cancellation a round swallowed
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + self.config.interval_s, loop.time())
            await self.probe_all()

    async def stop(self) -> None:
        """End the probe loop and any probe outside it (bounded: see ``narwhal.tasks``)."""
        self._stopping = True
        for task in (self._task, *self._extra):
            if task is not None and not await stop_task(task, STOP_WAIT_S):
                log.warning("health task %s did not stop within %.1f s of its cancellation; "
                            "left behind", task.get_name(), STOP_WAIT_S)
