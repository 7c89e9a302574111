"""When to profile: engines that join, drift or failed a profile; saving what was learned.

One background task wakes on demand (an engine changed, drift crossed the threshold) or
every second, starts at most a few profiles at once, backs off after failures (1 s, 2 s,
4 s, ... 30 s) and writes the learned state to the state file when it changed. Stopping is
bounded: a task that does not end within ``STOP_WAIT_S`` of its cancellation is logged and
left behind rather than waited for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from narwhal.fleet.engine import Engine, Health
from narwhal.learning.latency import PrefillModel
from narwhal.learning.learned import EngineLearned
from narwhal.learning.output_length import OutputLengths
from narwhal.learning.persistence import read_section, write_section
from narwhal.learning.profiler import Profile, ProfileError, Profiler
from narwhal.learning.workers import ProfileLocks, WorkerLocks

log = logging.getLogger("narwhal.learning")

TICK_S = 1.0
START_WAIT_S = 15.0
"""In predictive mode, how long start-up waits for the first profiles of healthy engines."""
STOP_WAIT_S = 1.0
"""How long ``stop`` waits for its cancelled tasks to end."""
MAX_CONCURRENT_PROFILES = 4
BACKOFF_S = (1.0, 30.0)
SAVE_INTERVAL_S = 30.0
REPROFILE_MIN_INTERVAL_S = 3.0
"""Drift re-profiles an engine at most this often."""
ADOPT_MARGIN_S = REPROFILE_MIN_INTERVAL_S
"""A peer worker's profile this much older than the need for one is still adopted."""
STATE_KEY = "learned"
STATE_VERSION = 1


async def sleep_or_wake(event: asyncio.Event, timeout_s: float) -> None:
    """Return when ``event`` is set or ``timeout_s`` has passed (the timer sets it).

    Not ``wait_for(event.wait(), ...)``: on Python 3.11 that returns normally when the task
    is cancelled just as the wait completes, dropping the cancellation, and its timeout
    exception is ``asyncio.TimeoutError``, not the builtin, before 3.11. A cancellation here
    always propagates.
    """
    timer = asyncio.get_running_loop().call_later(timeout_s, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


class Supervisor:
    """Profiles the engines of ``learned`` and keeps the state file of them and ``output``.

    ``on_profiled(engine)`` is called after each good profile; ``shared_path``: a file every
    worker process opens, to take turns profiling (None in a single process).
    """

    def __init__(self, learned: Mapping[int, EngineLearned], output: OutputLengths,
                 on_profiled: Callable[[Engine], None], *, model: str,
                 state_file: str | None = None, shared_path: str | None = None) -> None:
        self.learned = learned
        self.output = output
        self.on_profiled = on_profiled
        self.locks: ProfileLocks = WorkerLocks(shared_path)
        self._publish: Callable[[Engine, dict[str, Any]], None] | None = None
        self._adopted: dict[str, float] = {}  # engine -> profiled_at of a shared profile
        self.started_at = time.time()
        self.profiler = Profiler(model)
        self.state_file = state_file
        self.dirty = False
        self._saved_at = time.monotonic()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._slots: asyncio.Semaphore | None = None
        if self.state_file:
            self.restore(read_section(self.state_file, STATE_KEY))

    def added(self, learned: EngineLearned) -> None:
        """An engine joined the fleet: take its stored profile (same name and URL) if the
        state file holds one, as at start."""
        if self.state_file:
            data = read_section(self.state_file, STATE_KEY)
            engines = data.get("engines") if isinstance(data, dict) else None
            if isinstance(engines, dict) and self._take(learned, engines.get(learned.engine.name)):
                learned.profile_reason = "restored"

    def removed(self, learned: EngineLearned) -> None:
        """An engine left the fleet: a profile of it still running is cancelled."""
        for task in list(self._running):
            if task.get_name() == f"profile {learned.engine.name}" and not task.done():
                task.cancel()

    def share(self, locks: ProfileLocks,
              publish: Callable[[Engine, dict[str, Any]], None]) -> None:
        """Several routers share the fleet (``cluster/``): take turns through ``locks``
        (which wrap the workers' own) and hand each profile made here to ``publish``."""
        self.locks = locks
        self._publish = publish

    def adopt_shared(self, index: int, entry: dict[str, Any]) -> bool:
        """Another router's profile of engine ``index`` (an entry of the state file's
        shape): taken when newer than the one held here. True when taken."""
        try:
            learned = self.learned[index]
        except (IndexError, KeyError):
            return False
        at = entry.get("profiled_at")
        if not isinstance(at, (int, float)) or (learned.profiled_at is not None
                                                and at <= learned.profiled_at):
            return False
        if not self._take(learned, entry):
            return False
        self._adopted_now(learned, "shared")
        self._adopted[learned.engine.name] = float(at)
        self.dirty = True
        log.info("engine %s: adopted another router's profile", learned.engine.name)
        self.on_profiled(learned.engine)
        return True

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def start(self, *, wait: bool) -> None:
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_PROFILES)
        self.locks.open()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="learning")
        if wait:
            await self._first_profiles(START_WAIT_S)

    async def _first_profiles(self, timeout_s: float) -> None:
        """Until every healthy engine has a model or has failed a profile (bounded)."""
        self._kick()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(e.engine.health is Health.HEALTHY and e.prefill is None
                       and e.failures == 0 and e.engine.config.role != "decode"
                       for e in self.learned.values()):
                return
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Cancel the loop and the running profiles, wait for them (bounded), save."""
        tasks = [t for t in (self._task, *self._running) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_WAIT_S)
            for task in pending:
                log.warning("learning task %s did not stop within %.1f s of its cancellation; "
                            "left behind", task.get_name(), STOP_WAIT_S)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("learning task %s failed", task.get_name(), exc_info=task.exception())
        self._task = None
        self.locks.close()
        if self.dirty:
            self.save()

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            self._kick()
            if self.dirty and time.monotonic() - self._saved_at >= SAVE_INTERVAL_S:
                await self._save_soon()
            await sleep_or_wake(wake, self._next_tick())
            wake.clear()

    def _next_tick(self) -> float:
        """Seconds to sleep: a tick, or less when a due re-profile becomes allowed sooner."""
        now = time.monotonic()
        wait = TICK_S
        for learned in self.learned.values():
            if learned.due is not None and not learned.profiling:
                allowed = max(learned.retry_at, learned.profiled_mono + REPROFILE_MIN_INTERVAL_S)
                wait = min(wait, max(0.01, allowed - now))
        return wait

    def _kick(self) -> None:
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        for learned in self.learned.values():
            if self._wants(learned, now):
                learned.profiling = True
                task = loop.create_task(self._profile(learned),
                                        name=f"profile {learned.engine.name}")
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    @staticmethod
    def _wants(learned: EngineLearned, now: float) -> bool:
        engine = learned.engine
        if (engine.health is not Health.HEALTHY or engine.maintenance or learned.profiling
                or now < learned.retry_at or engine.config.role == "decode"):
            return False
        if learned.prefill is None:
            return True
        return (learned.due is not None
                and now >= learned.profiled_mono + REPROFILE_MIN_INTERVAL_S)

    async def _profile(self, learned: EngineLearned) -> None:
        engine = learned.engine
        reason = learned.due or "join"
        wanted_at = learned.wanted_at if learned.due else self.started_at
        slots = self._slots
        assert slots is not None
        try:
            async with slots, self.locks.hold(engine.index) as locked:
                shared = self._adopted.get(engine.name, -1.0) >= wanted_at - ADOPT_MARGIN_S
                if not (locked and (shared or self._adopt(learned, wanted_at, reason))):
                    profile = await self.profiler.profile(engine, learned.load, learned.prefill)
                    self._apply(learned, profile, reason)
                    if self._publish is not None:
                        self._publish(engine, self._entry(learned))
                await self._save_soon()  # under the lock: the next worker can adopt it
        except ProfileError as exc:
            self._failed(learned, f"{exc.code}: {exc.message}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a profile must never kill the supervisor
            log.exception("profiling %s failed", engine.name)
            self._failed(learned, f"internal_error: {exc}")
        else:
            self.on_profiled(engine)
        finally:
            learned.profiling = False
            self.wake()

    def _failed(self, learned: EngineLearned, error: str) -> None:
        learned.failures += 1
        learned.error = error
        low, high = BACKOFF_S
        learned.retry_at = time.monotonic() + min(high, low * 2 ** (learned.failures - 1))
        learned.outcomes[1] += 1
        log.warning("profiling engine %s failed (%s); retrying in %.0f s", learned.engine.name,
                    error, learned.retry_at - time.monotonic())

    def _apply(self, learned: EngineLearned, profile: Profile, reason: str) -> None:
        learned.prefill = profile.prefill
        if profile.tpot_s is not None:
            learned.tpot.reset(profile.tpot_s, profile.batch)
        learned.drift_ttft.reset()
        learned.drift_tpot.reset()
        learned.profiled_at = time.time()
        learned.profiled_mono = time.monotonic()
        learned.profile_reason = reason
        learned.profiles += 1
        learned.failures = 0
        learned.error = None
        learned.due = None
        learned.outcomes[0] += 1
        self.dirty = True
        tpot = learned.tpot.base_s
        log.info("engine %s profiled (%s): prefill %.0f tokens/s + %.1f ms, tpot %s",
                 learned.engine.name, reason, profile.prefill.tokens_per_s,
                 profile.prefill.overhead_s * 1e3,
                 "unknown" if tpot is None else f"{tpot * 1e3:.2f} ms")

    # -- the state file ---------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        engines: dict[str, Any] = {}
        for learned in self.learned.values():
            if learned.prefill is not None:
                engines[learned.engine.name] = self._entry(learned)
        return {"version": STATE_VERSION, "saved_at": time.time(), "engines": engines,
                "output_length": self.output.as_json()}

    @staticmethod
    def _entry(learned: EngineLearned) -> dict[str, Any]:
        """One engine's learned model as stored (state file, shared profiles)."""
        assert learned.prefill is not None
        return {
            "url": learned.engine.config.url,
            **learned.prefill.as_json(),
            "tpot_s": learned.tpot.base_s,
            "tpot_growth_s": learned.tpot.growth_s,
            "profiled_at": learned.profiled_at,
        }

    def _adopt(self, learned: EngineLearned, wanted_at: float, reason: str) -> bool:
        """Take a peer worker's profile of the engine from the state file when it is recent
        enough to answer this need; True when adopted."""
        if not self.state_file:
            return False
        data = read_section(self.state_file, STATE_KEY)
        engines = data.get("engines") if isinstance(data, dict) else None
        stored = engines.get(learned.engine.name) if isinstance(engines, dict) else None
        at = stored.get("profiled_at") if isinstance(stored, dict) else None
        if not isinstance(at, (int, float)) or at < wanted_at - ADOPT_MARGIN_S:
            return False
        if not self._take(learned, stored):
            return False
        self._adopted_now(learned, reason)
        log.info("engine %s: adopted a peer worker's profile", learned.engine.name)
        return True

    @staticmethod
    def _adopted_now(learned: EngineLearned, reason: str) -> None:
        learned.profiled_mono = time.monotonic()
        learned.profile_reason = reason
        learned.profiles += 1
        learned.failures, learned.error, learned.due = 0, None, None
        learned.drift_ttft.reset()
        learned.drift_tpot.reset()

    def _take(self, learned: EngineLearned, stored: object) -> bool:
        """Load one engine's stored model (same URL only); True when it held one."""
        if not isinstance(stored, dict) or stored.get("url") != learned.engine.config.url:
            return False
        prefill = PrefillModel.from_json(stored)
        if prefill is None:
            return False
        learned.prefill = prefill
        tpot, growth = stored.get("tpot_s"), stored.get("tpot_growth_s")
        if isinstance(growth, (int, float)) and growth >= 0:
            learned.tpot.growth_s = float(growth)
        if isinstance(tpot, (int, float)) and tpot > 0:
            learned.tpot.reset(float(tpot))
        at = stored.get("profiled_at")
        learned.profiled_at = float(at) if isinstance(at, (int, float)) else None
        return True

    def restore(self, data: object) -> None:
        """Take back what a previous run saved, for engines with the same name and URL."""
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            return
        engines = data.get("engines")
        if isinstance(engines, dict):
            for learned in self.learned.values():
                if self._take(learned, engines.get(learned.engine.name)):
                    learned.profile_reason = "restored"
        self.output.load(data.get("output_length"))

    def save(self) -> bool:
        """Write the learned state now (blocking); True when written or nothing to do."""
        if not self.state_file:
            return True
        self.dirty = False
        self._saved_at = time.monotonic()
        return self._write(self.state_file, self.snapshot())

    async def _save_soon(self) -> None:
        if not self.state_file:
            self.dirty = False
            return
        snapshot = self.snapshot()
        self.dirty = False
        self._saved_at = time.monotonic()
        path = self.state_file
        await asyncio.get_running_loop().run_in_executor(None, self._write, path, snapshot)

    @staticmethod
    def _write(path: str, snapshot: dict[str, Any]) -> bool:
        """Write ``snapshot``, keeping any engine a peer worker profiled more recently."""
        stored = read_section(path, STATE_KEY)
        theirs = stored.get("engines") if isinstance(stored, dict) else None
        if isinstance(theirs, dict):
            ours = snapshot["engines"]
            for name, entry in theirs.items():
                mine = ours.get(name)
                if not isinstance(entry, dict):
                    continue
                at, my_at = entry.get("profiled_at"), (mine or {}).get("profiled_at")
                if mine is None or (isinstance(at, (int, float))
                                    and (not isinstance(my_at, (int, float)) or at > my_at)):
                    ours[name] = entry
        return write_section(path, STATE_KEY, snapshot)
