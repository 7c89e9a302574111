"""The names the router serves: configured models, their aliases, and the adapters engines
report loaded, each resolved to the name the engine is sent and the engines that take it.

A :class:`Served` is what a request's ``model`` resolves to. Configured models come from the
configuration (``model``, or ``models`` with aliases and ``engines[].models``); adapters come
from the engines' ``GET /v1/models`` (entries whose ``parent`` is a base model the engine
serves, as vLLM lists LoRA adapters), read with every health probe: an adapter is servable
on the engines that list it, and unknown (404) once none does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from narwhal.config import Config, EngineConfig

log = logging.getLogger("narwhal.models")

RETIRED_LIMIT = 1024
"""Adapters gone from every engine whose objects are kept for reuse if they come back."""

Card = tuple[str, "str | None", "str | None"]
"""One entry of an engine's ``GET /v1/models``: (id, parent, root)."""


class Served:
    """One servable name's meaning (aliases resolve to their model's object).

    ``name``: what the engine is sent. ``index``: the base model's position in the
    configuration (per-model accounting, budgets, learning). ``engines``: indices of the
    engines that serve it now, None for every engine (replaced, never mutated, so a reader
    sees one consistent set). ``base``: the base model (itself for a configured model).
    ``rename``: answers carry the name the client sent even when it is this name (with
    several models an engine may answer with another of its names).
    """

    __slots__ = ("base", "budget_s", "created", "engines", "index", "name", "rename", "root")

    def __init__(self, name: str, index: int, *, budget_s: float | None = None,
                 engines: frozenset[int] | None = None, base: Served | None = None,
                 root: str | None = None, rename: bool = False) -> None:
        self.name = name
        self.index = index
        self.budget_s = budget_s
        self.engines = engines
        self.base: Served = self if base is None else base
        self.root = root
        self.rename = rename
        self.created = int(time.time())

    @property
    def adapter(self) -> bool:
        return self.base is not self

    def on(self, engine: int) -> bool:
        """Does the engine of this index serve it now?"""
        engines = self.engines
        return engines is None or engine in engines

    def __repr__(self) -> str:
        return f"Served({self.name!r})"


class Catalog:
    """Every name a client may send (``names``), and which engine serves which.

    ``single``: one configured model on every engine (no per-request work beyond the name
    lookup while no adapter is loaded). ``labelled``: the configuration uses ``models`` (per-
    model metrics). ``version`` changes whenever the set of names or their engines does.
    """

    def __init__(self, config: Config) -> None:
        self.models: list[Served] = []
        self.names: dict[str, Served] = {}
        self.aliases: dict[str, Served] = {}
        for i, model in enumerate(config.served_models):
            served = Served(model.name, i, budget_s=model.ttft_budget_s)
            self.models.append(served)
            self.names[model.name] = served
            for alias in model.aliases:
                self.names[alias] = self.aliases[alias] = served
        self.labelled = bool(config.models)
        self.single = True
        self.bases: dict[int, tuple[Served, ...]] = {}  # per engine slot
        self.adapters: dict[int, dict[str, Served]] = {}  # per engine slot
        self._retired: dict[str, Served] = {}
        self._ignored: set[tuple[int, str]] = set()
        self.version = 0
        self.set_engines(dict(enumerate(config.engines)))

    def set_engines(self, engines: Mapping[int, EngineConfig]) -> None:
        """The fleet is ``engines`` (by board slot): each model's engines follow their
        ``models`` keys; a slot no longer in the fleet loses its adapters."""
        for slot in self.adapters.keys() - engines.keys():
            for served in self.adapters.pop(slot).values():
                self._leave(slot, served)
        for model in self.models:
            where = frozenset(k for k, e in engines.items()
                              if e.models is None or model.name in e.models)
            model.engines = None if len(where) == len(engines) else where
        self.single = len(self.models) == 1 and self.models[0].engines is None
        for served in self.models:
            served.rename = not self.single
        self.bases = {k: tuple(m for m in self.models if m.on(k)) for k in engines}
        for slot in engines:
            self.adapters.setdefault(slot, {})
        self.version += 1

    def set_budgets(self, config: Config) -> None:
        """New TTFT budgets of the configured models (same names), live; adapters follow
        their base model's."""
        budgets = {m.name: m.ttft_budget_s for m in config.served_models}
        for model in self.models:
            model.budget_s = budgets.get(model.name, model.budget_s)
        for served in self.names.values():
            if served.adapter:
                served.budget_s = served.base.budget_s

    def resolve(self, name: str) -> Served | None:
        return self.names.get(name)

    def first_model(self, engine: int) -> str:
        """The base model the router's own requests to this engine name (profiling)."""
        bases = self.bases.get(engine)
        return bases[0].name if bases else self.models[0].name

    # -- adapters, from the engines' /v1/models ---------------------------------------------
    def engine_reported(self, engine: int, cards: Iterable[Card]) -> bool:
        """The engine's ``GET /v1/models`` listed ``cards``: its adapters are now those whose
        parent is a base model it serves. True when anything changed."""
        found: dict[str, tuple[Served, str | None]] = {}
        for name, parent, root in cards:
            if parent is None or name in found:
                continue
            base = self.names.get(parent)
            known = self.names.get(name)
            why = None
            if base is None or base.adapter or not base.on(engine):
                why = f"its parent {parent!r} is not a model this engine serves"
            elif known is not None and not known.adapter:
                why = "the name is a configured model or alias"
            elif known is not None and known.base is not base.base:
                why = f"it is {known.base.name!r}'s adapter on another engine"
            if base is None or why is not None:
                self._ignore(engine, name, why or "")
                continue
            found[name] = (base.base, root)
        held = self.adapters.get(engine)
        if held is None or found.keys() == held.keys():  # None: the engine left the fleet
            return False
        for name in held.keys() - found.keys():
            self._leave(engine, held.pop(name))
        for name in found.keys() - held.keys():
            base, root = found[name]
            held[name] = self._join(engine, name, base, root)
        self.version += 1
        return True

    def _join(self, engine: int, name: str, base: Served, root: str | None) -> Served:
        served = self.names.get(name)
        if served is None:
            served = self._retired.pop(name, None)
            if served is None or served.base is not base:
                served = Served(name, base.index, budget_s=base.budget_s, engines=frozenset(),
                                base=base, root=root, rename=base.rename)
            self.names[name] = served
            log.info("adapter %s of %s is servable", name, base.name)
        assert served.engines is not None
        served.engines = served.engines | {engine}
        return served

    def _leave(self, engine: int, served: Served) -> None:
        assert served.engines is not None
        served.engines = served.engines - {engine}
        if not served.engines:
            del self.names[served.name]
            self._retired[served.name] = served
            if len(self._retired) > RETIRED_LIMIT:
                del self._retired[next(iter(self._retired))]
            log.info("adapter %s is no longer loaded on any engine", served.name)

    def _ignore(self, engine: int, name: str, why: str) -> None:
        if (engine, name) not in self._ignored:
            self._ignored.add((engine, name))
            log.warning("engine %d lists %r, not served through the router: %s",
                        engine, name, why)

    # -- reporting --------------------------------------------------------------------------
    def names_on(self, engine: int) -> list[str]:
        """Every name a client may send that this engine can serve now."""
        out: list[str] = []
        for model in self.bases.get(engine, ()):
            out.append(model.name)
            out.extend(a for a, m in self.aliases.items() if m is model)
        out.extend(sorted(self.adapters.get(engine, ())))
        return out

    def served_on(self, engine: int) -> list[Served]:
        """The models and adapters this engine can serve now (no aliases)."""
        held = self.adapters.get(engine, {})
        return [*self.bases.get(engine, ()), *(held[n] for n in sorted(held))]

    def cards(self) -> list[dict[str, Any]]:
        """``GET /v1/models``'s ``data``: models, aliases, then adapters (with ``parent``)."""
        out: list[dict[str, Any]] = []
        for model in self.models:
            out.append(_card(model.name, model.created, model.name, None))
            out.extend(_card(a, model.created, model.name, None)
                       for a, m in self.aliases.items() if m is model)
        for name, served in sorted(self.names.items()):
            if served.adapter and name == served.name:
                out.append(_card(name, served.created, served.root or name, served.base.name))
        return out


def _card(name: str, created: int, root: str, parent: str | None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "narwhal",
            "root": root, "parent": parent}


def parse_cards(data: object) -> list[Card] | None:
    """The (id, parent, root) entries of a ``GET /v1/models`` answer; None when it is not
    the OpenAI list shape."""
    if not isinstance(data, dict):
        return None
    items = data.get("data")
    if not isinstance(items, list):
        return None
    cards: list[Card] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        name, parent, root = item.get("id"), item.get("parent"), item.get("root")
        if isinstance(name, str) and name:
            cards.append((name, parent if isinstance(parent, str) and parent else None,
                          root if isinstance(root, str) else None))
    return cards
