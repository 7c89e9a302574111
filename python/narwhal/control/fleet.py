"""Changing a running router: reload the configuration file, add and remove engines, take
what discovery found.

Every change goes the same way. The new fleet document (``store.py``) is computed and
validated first (an invalid configuration changes nothing), written, and then applied here in
one synchronous step on the event loop (so no request sees half of it) and in every other
worker when woken (each applies the same document the same way):

* an engine added is built, probed at once and profiled, and takes placements only then
  (``Engine.joining``); it gets a board slot of its own for life;
* an engine removed takes no new placements (``Engine.removed``); its in-flight requests
  finish on it; once nothing is in flight on its slot in any worker it is forgotten and its
  connections close. A changed URL (or API key variable) is a removal plus an addition;
* other engine keys (limits, role, weight, wave, models, timeouts) and the live settings
  (``changes.LIVE_KEYS``) apply at once; keys that need a restart are refused by name.

Open streams are never cut: nothing here touches a request in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from narwhal._narwhal_fast import Board
from narwhal.admission.gate import AdmissionQueue
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.config import Config, ConfigError, EngineConfig, load_config, parse_config
from narwhal.config.loader import config_data, parse_engine
from narwhal.control.changes import assign_slots, engine_entries, restart_keys
from narwhal.control.store import Document, empty_document
from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine, Health
from narwhal.fleet.health import HealthMonitor
from narwhal.fleet.state import RouterState
from narwhal.flow.completion import CompletionFlow
from narwhal.learning import Learning
from narwhal.request.models import Catalog
from narwhal.scheduling.placement import Scheduler
from narwhal.scheduling.policies import make_policy

log = logging.getLogger("narwhal.fleet")

FLEET_DOC = "fleet:admin"
"""The cluster document kind of the admin API's engine changes."""
REAP_INTERVAL_S = 0.1
"""How often engines leaving the fleet are checked for requests still in flight."""


def identity(engine: EngineConfig) -> str:
    """What makes an engine the same engine across a change: its URL and the variable its
    API key comes from (either changed: a removal plus an addition, new connections)."""
    return f"{engine.url} {engine.api_key_env or ''}".rstrip()


class Store(Protocol):
    def read(self) -> Document: ...
    def update(self, change: Callable[[Document], Document | None]) -> Document | None: ...


class ChangeRefused(Refusal):
    """A change that cannot be made: 400 ``invalid_request`` (409 ``conflict`` for an
    engine name already in the fleet); ``message`` says why, in the start-up check's words."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"
                 ) -> None:
        super().__init__(code, message, param=param)


class Parts:
    """What a fleet change reaches: the running router's parts (built by ``app.py``)."""

    def __init__(self, *, board: Board, catalog: Catalog, learning: Learning,
                 health: HealthMonitor, state: RouterState, scheduler: Scheduler,
                 queue: AdmissionQueue, predictive: PredictiveAdmission,
                 flow: CompletionFlow, make_engine: Callable[[int, EngineConfig], Engine]
                 ) -> None:
        self.board = board
        self.catalog = catalog
        self.learning = learning
        self.health = health
        self.state = state
        self.scheduler = scheduler
        self.queue = queue
        self.predictive = predictive
        self.flow = flow
        self.make_engine = make_engine


class FleetControl:
    """Reload, admin engine changes and discovery for one worker (see the module docstring).

    ``engines``: the live list every part shares (mutated in place). ``notify_peers``: wake
    the other workers to apply the document (None: one process).
    """

    def __init__(self, config: Config, engines: list[Engine], parts: Parts, store: Store, *,
                 config_path: str | None = None,
                 notify_peers: Callable[[], None] | None = None,
                 overrides: Callable[[Config], Config] | None = None) -> None:
        self.config = config
        self.engines = engines
        self.parts = parts
        self.store = store
        self.config_path = config_path
        self.notify_peers = notify_peers
        self.overrides = overrides  # the command line's, over every configuration read
        self.generation = -1
        self.leaving: list[Engine] = []
        self.discovered: Sequence[Mapping[str, Any]] = ()
        self._reaper: asyncio.Task[None] | None = None
        self._stopped = False
        self._share: Callable[[dict[str, Any]], None] | None = None

    # -- several routers (cluster/) ----------------------------------------------------------
    def share(self, publish: Callable[[dict[str, Any]], None]) -> None:
        """Several routers share the fleet: the admin API's engine changes (and a reload's
        dropping them) go to ``publish`` and so to every other router, which takes them
        with ``received``. Each router's file and discovery stay its own."""
        self._share = publish

    def received(self, doc: object) -> None:
        """Another router's admin engine changes (its ``added`` and ``removed``)."""
        if not isinstance(doc, dict):
            return
        added, removed = doc.get("added"), doc.get("removed")
        if not isinstance(added, list) or not isinstance(removed, list):
            return
        try:
            self._change(lambda d: {**d, "added": added, "removed": removed},
                         "another router's admin change", share=False)
        except Refusal as exc:
            log.error("another router's engine change not applied here: %s", exc.message)

    @staticmethod
    def first_document(config: Config) -> Document:
        """The document of a router starting with ``config`` (slots 0..n-1 in file order)."""
        document = empty_document(config_data(config))
        document["slots"] = {e.name: [i, identity(e)] for i, e in enumerate(config.engines)}
        document["used"] = len(config.engines)
        return document

    # -- what operators ask ------------------------------------------------------------------
    def reload(self) -> dict[str, Any]:
        """Re-read the configuration file and apply it. Raises ChangeRefused (the file is
        invalid, or changes keys that need a restart); nothing changes then."""
        if self.config_path is None:
            raise ChangeRefused("this router was started without a configuration file "
                                "(--demo): there is nothing to reload")
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            raise ChangeRefused(str(exc)) from None
        if self.overrides is not None:
            new = self.overrides(new)
        restart = restart_keys(self.config, new)
        if restart:
            raise ChangeRefused(
                f"{self.config_path}: these keys change only with a restart: "
                f"{', '.join(restart)} (nothing was changed)")
        data = config_data(new)
        # Admin-API changes are not in the file: a reload drops them.
        return self._change(lambda doc: {**doc, "data": data, "added": [], "removed": []},
                            "reload")

    def add_engine(self, entry: object) -> dict[str, Any]:
        """``POST /admin/engines``: one engine entry, the keys of ``engines[]``."""
        try:
            engine = parse_engine(entry)
        except ConfigError as exc:
            raise ChangeRefused(str(exc).removeprefix("<engine>: "), exc.key or None) from None
        if any(e.name == engine.name for e in self.engines):
            raise ChangeRefused(f"an engine named {engine.name!r} is in the fleet already",
                                "name", "conflict")
        raw = config_data(engine)

        def change(doc: Document) -> Document:
            added = [e for e in doc["added"] if e.get("name") != engine.name] + [raw]
            removed = [n for n in doc["removed"] if n != engine.name]
            return {**doc, "added": added, "removed": removed}

        return self._change(change, f"engine {engine.name} added")

    def remove_engine(self, name: str) -> dict[str, Any]:
        """``DELETE /admin/engines/{name}``: drain it and take it out of the fleet."""
        if not any(e.name == name for e in self.engines):
            raise Refusal("not_found", f"No engine named {name!r}")

        def change(doc: Document) -> Document:
            added = [e for e in doc["added"] if e.get("name") != name]
            return {**doc, "added": added, "removed": [*doc["removed"], name]}

        return self._change(change, f"engine {name} removed")

    def discovered_engines(self, entries: Sequence[Mapping[str, Any]], source: str) -> bool:
        """Discovery found these engine entries (the whole discovered list); True when taken
        (applied, or already the fleet's). An invalid list changes nothing (logged)."""
        if list(entries) == list(self.discovered):
            return True
        try:
            self._change(lambda doc: {**doc, "discovered": list(entries)}, source, share=False)
        except ChangeRefused as exc:
            log.error("%s: not applied: %s", source, exc.message)
            return False
        self.discovered = list(entries)
        return True

    # -- the change, in every worker ---------------------------------------------------------
    def _change(self, edit: Callable[[Document], Document], what: str, *,
                share: bool = True) -> dict[str, Any]:
        problem: list[ChangeRefused] = []

        def change(doc: Document) -> Document | None:
            new = edit(doc)
            try:
                config = self._validate(new)
                busy = {e.index: True for e in self.leaving}
                for slot in range(self.parts.board.engines):
                    if slot not in busy and any(self.parts.board.inflight(slot)):
                        busy[slot] = True
                slots, used = assign_slots(
                    [(e.name, identity(e)) for e in config.engines],
                    {n: (s, u) for n, (s, u) in doc["slots"].items()}, doc["used"], busy)
            except ChangeRefused as exc:
                problem.append(exc)
                return None
            except ValueError as exc:
                problem.append(ChangeRefused(str(exc)))
                return None
            new["slots"] = {n: [s, u] for n, (s, u) in slots.items()}
            new["used"] = used
            if {k: v for k, v in new.items() if k != "generation"} == {
                    k: v for k, v in doc.items() if k != "generation"}:
                return None  # nothing changes
            new["generation"] = doc["generation"] + 1
            return new

        document = self.store.update(change)
        if problem:
            raise problem[0]
        if document is not None:
            log.warning("fleet change (%s): generation %d", what, document["generation"])
            self.apply(document)
            if self.notify_peers is not None:
                self.notify_peers()
            if share and self._share is not None:
                self._share({"added": document["added"], "removed": document["removed"]})
        return self.describe()

    def _validate(self, doc: Document) -> Config:
        data = dict(doc["data"])
        data["engines"] = engine_entries(data, doc["added"], doc["removed"], doc["discovered"])
        if not data["engines"]:
            data.pop("engines")
        try:
            return parse_config(data, source=self.config_path or "<fleet>")
        except ConfigError as exc:
            raise ChangeRefused(str(exc)) from None

    def sync(self) -> None:
        """A peer changed the fleet document: apply it (idempotent)."""
        try:
            document = self.store.read()
        except OSError:
            log.exception("cannot read the fleet document")
            return
        self.apply(document)

    def apply(self, document: Document) -> None:
        """Make this worker's fleet the document's (nothing when already applied)."""
        if document["generation"] <= self.generation:
            return
        try:
            config = self._validate(document)
        except ChangeRefused as exc:  # written by a peer that validated it: not expected
            log.error("fleet document generation %d not applied: %s",
                      document["generation"], exc.message)
            return
        slots = {name: (slot, url) for name, (slot, url) in document["slots"].items()}
        first = self.generation < 0
        self.generation = document["generation"]
        self._apply_engines(config, slots, joining=not first)
        self._apply_settings(config)
        self.config = config

    def _apply_engines(self, config: Config, slots: Mapping[str, tuple[int, str]], *,
                       joining: bool) -> None:
        parts = self.parts
        by_name = {e.name: e for e in self.engines}
        for engine in list(self.engines):
            if slots.get(engine.name, (None, None))[0] != engine.index:
                self._remove(engine)
        added: list[Engine] = []
        for cfg in config.engines:
            slot = slots[cfg.name][0]
            existing = by_name.get(cfg.name)
            if existing is not None and existing.index == slot:
                if existing.config != cfg:
                    self._update(existing, cfg)
                continue
            for old in [e for e in self.leaving if e.index == slot]:
                self._forget(old)  # the slot was free of requests when handed out
            engine = parts.make_engine(slot, cfg)
            engine.joining = joining
            self.engines.append(engine)
            added.append(engine)
        self.engines.sort(key=lambda e: e.index)
        parts.catalog.set_engines({e.index: e.config for e in self.engines})
        for engine in added:
            engine.model = parts.catalog.first_model(engine.index)
            parts.board.set_engine_up(engine.index, False)
            parts.health.adopt(engine)
            parts.learning.add_engine(engine)
            if joining:
                log.warning("engine %s (%s) joins the fleet: probing and profiling it first",
                            engine.name, engine.config.url)
                parts.health.probe_soon(engine)
        parts.state.maintenance.refresh()
        if self.leaving and self._reaper is None and not self._stopped:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(),
                                                                  name="fleet reaper")

    def _update(self, engine: Engine, cfg: EngineConfig) -> None:
        old = engine.config
        engine.config = cfg
        changed = [f for f in ("role", "wave", "max_prefill", "max_decode", "kv_cache_tokens",
                               "weight", "header_timeout_s", "token_timeout_s", "migrate",
                               "models", "dialect")
                   if getattr(old, f) != getattr(cfg, f)]
        log.warning("engine %s: %s changed", engine.name, ", ".join(changed) or "nothing")
        if old.kv_cache_tokens != cfg.kv_cache_tokens and self.parts.learning.prefix:
            self.parts.learning.prefix.add_engine(engine)
        self.parts.board.set_engine_up(engine.index, engine.serves())

    def _remove(self, engine: Engine) -> None:
        engine.removed = True
        self.engines.remove(engine)
        self.leaving.append(engine)
        self.parts.board.set_engine_up(engine.index, False)
        log.warning("engine %s leaves the fleet: no new requests; its in-flight requests "
                    "finish", engine.name)

    def _forget(self, engine: Engine) -> None:
        """Nothing is in flight on a leaving engine: it is gone."""
        self.leaving.remove(engine)
        self.parts.learning.remove_engine(engine)
        task = asyncio.get_running_loop().create_task(engine.client.close())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        log.warning("engine %s has left the fleet", engine.name)

    async def _reap(self) -> None:
        try:
            while self.leaving:
                await asyncio.sleep(REAP_INTERVAL_S)
                for engine in list(self.leaving):
                    if not any(self.parts.board.inflight(engine.index)):
                        self._forget(engine)
        finally:
            self._reaper = None

    def _apply_settings(self, config: Config) -> None:
        parts = self.parts
        parts.queue.queue_limit = config.admission.queue_limit
        parts.queue.max_wait_s = config.admission.max_wait_s
        parts.predictive.budget_s = config.admission.ttft_budget_s
        parts.flow.serving = config.serving
        parts.health.reconfigure(config.health)
        parts.learning.reconfigure(config)
        parts.state.config = config
        parts.catalog.set_budgets(config)
        scheduling = config.scheduling
        if scheduling.policy != self.config.scheduling.policy:
            parts.scheduler.policy = make_policy(scheduling.policy)
        parts.scheduler.prefix_chars = scheduling.affinity_prefix_chars
        parts.queue.kick()  # limits may have grown, engines may have come

    # -- the joining engines -----------------------------------------------------------------
    def engine_changed(self, engine: Engine) -> None:
        """An engine's health or profile changed: a joining engine that is healthy and
        profiled (a decode engine: healthy) now takes placements."""
        if not engine.joining or engine.removed:
            return
        learning = self.parts.learning
        if engine.health is not Health.HEALTHY or not (engine.config.role == "decode"
                                              or learning.profiled(engine)):
            return
        engine.joining = False
        log.warning("engine %s has joined the fleet", engine.name)

    # -- reporting and lifecycle -------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "engines": [{"name": e.name, "url": e.config.url, "state": e.state}
                        for e in self.engines],
            "leaving": [{"name": e.name, "url": e.config.url,
                         "inflight": dict(zip(("prefill", "decode"),
                                              self.parts.board.inflight(e.index),
                                              strict=True))}
                        for e in self.leaving],
        }

    def slot_names(self) -> list[str | None]:
        """The engine name in each board slot (None: free), for ``/metrics``."""
        names: list[str | None] = []
        for engine in (*self.engines, *self.leaving):
            if engine.index >= len(names):
                names.extend([None] * (engine.index + 1 - len(names)))
            names[engine.index] = engine.name
        return names

    async def stop(self) -> None:
        self._stopped = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(e.client.close() for e in self.leaving),
                             return_exceptions=True)
