"""Maintenance waves and per-engine drain: which engines take no new placements, and when the
whole fleet is under maintenance."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from narwhal.fleet.engine import Engine

log = logging.getLogger("narwhal.maintenance")

ALL_WAVES = "*"


class UnknownWave(ValueError):
    """A wave name no configured engine belongs to."""

    def __init__(self, index: int, wave: str):
        super().__init__(f"no engine belongs to wave {wave!r}")
        self.index = index
        self.wave = wave


class Maintenance:
    """The set of waves under maintenance, kept in concrete wave names (``"*"`` expands to
    every configured wave, so turning ``"*"`` on and one wave off leaves the others in).

    Engines of a wave under maintenance take no new placements; their in-flight requests
    finish. When every configured wave is under maintenance the router refuses completions
    (503 ``maintenance``) and ``/ready`` says ``maintenance``.
    """

    def __init__(self, engines: Sequence[Engine], on_change: Callable[[Engine], None]):
        self.engines = engines
        self.on_change = on_change
        self.waves: tuple[str, ...] = tuple(dict.fromkeys(e.config.wave for e in engines))
        self.active: set[str] = set()
        self.whole = False  # every configured wave under maintenance

    def resolve(self, names: Iterable[str]) -> set[str]:
        """Wave names from a request body; ``"*"`` means every wave. Raises UnknownWave."""
        out: set[str] = set()
        for i, name in enumerate(names):
            if name == ALL_WAVES:
                out.update(self.waves)
            elif name in self.waves:
                out.add(name)
            else:
                raise UnknownWave(i, name)
        return out

    def set(self, waves: Iterable[str], enabled: bool) -> None:
        """Turn maintenance of ``waves`` (already resolved) on or off."""
        waves = set(waves)
        if enabled:
            self.active |= waves
        else:
            self.active -= waves
        self.whole = bool(self.waves) and self.active.issuperset(self.waves)
        log.warning(
            "maintenance %s for %s; now under maintenance: %s%s",
            "on" if enabled else "off", sorted(waves) or "no wave",
            sorted(self.active) or "none", " (whole fleet)" if self.whole else "",
        )
        for engine in self.engines:
            flag = engine.config.wave in self.active
            if engine.maintenance is not flag:
                engine.maintenance = flag
                self.on_change(engine)

    def refresh(self) -> None:
        """The fleet changed (engines added or removed): the configured waves are now those of
        the engines in it. An added engine of a wave under maintenance joins it; a wave no
        engine belongs to any more leaves the active set."""
        self.waves = tuple(dict.fromkeys(e.config.wave for e in self.engines))
        self.active &= set(self.waves)
        self.whole = bool(self.waves) and self.active.issuperset(self.waves)
        for engine in self.engines:
            flag = engine.config.wave in self.active
            if engine.maintenance is not flag:
                engine.maintenance = flag
                self.on_change(engine)

    def drain(self, engine: Engine, enabled: bool) -> None:
        """Drain one engine (no new placements, in-flight requests finish) or undo it."""
        if engine.draining is not enabled:
            engine.draining = enabled
            log.warning("engine %s: drain %s", engine.name, "on" if enabled else "off")
            self.on_change(engine)

    def describe(self) -> dict[str, object]:
        return {
            "waves": sorted(self.active),
            "whole": self.whole,
            "draining": sorted(e.name for e in self.engines if e.draining),
        }
