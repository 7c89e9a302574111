"""Health probing: each engine's /health (and load from /metrics) on a fixed interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from narwhal.fleet.engine import Engine, Health
from narwhal.upstream.client import UpstreamError

if TYPE_CHECKING:
    from narwhal.config import Health as HealthConfig

log = logging.getLogger("narwhal.health")

_LOAD_RE = re.compile(
    rb"^(vllm:num_requests_running|vllm:num_requests_waiting|sglang:num_running_reqs|"
    rb"sglang:num_queue_reqs)(?:\{[^}]*\})?\s+([0-9.eE+-]+)",
    re.MULTILINE,
)


class HealthMonitor:
    """Probes every engine; evicts after ``failures_to_evict``, restores after
    ``successes_to_restore``. An engine that answers (any status) or refuses the connection
    has a known state; a probe that times out leaves it unknown (monitoring staleness)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        config: HealthConfig,
        on_change: Callable[[Engine], None],
    ):
        self.engines = engines
        self.config = config
        self.on_change = on_change
        self.last_established: float | None = None  # loop time a probe last gave a known state
        self._task: asyncio.Task[None] | None = None

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(engine) for engine in self.engines))

    async def _probe(self, engine: Engine) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        ok = False
        try:
            status, _, _ = await engine.client.fetch("GET", "/health", timeout_s=cfg.timeout_s)
            ok = status == 200
            self.last_established = loop.time()
        except UpstreamError as exc:
            if exc.kind == "connect":
                self.last_established = loop.time()
        except Exception:  # a probe must never kill the monitor
            log.exception("probe of %s failed", engine.name)
        if ok and engine.token_ids:
            with contextlib.suppress(Exception):
                await self._scrape_load(engine)
        self._record(engine, ok)

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
            log.info("engine %s: %s -> %s", engine.name, before.value, engine.health.value)
            self.on_change(engine)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            await self.probe_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
