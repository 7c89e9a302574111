"""Engines for unit tests of placement and admission: healthy, with clients that never connect."""

from __future__ import annotations

from collections.abc import Iterable

from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine, Health
from narwhal.upstream.client import EngineClient


def healthy_engines(configs: Iterable[EngineConfig]) -> list[Engine]:
    """One healthy Engine per config, indexed in order."""
    engines = []
    for i, cfg in enumerate(configs):
        engine = Engine(i, cfg, EngineClient(cfg.url))
        engine.health = Health.HEALTHY
        engines.append(engine)
    return engines
