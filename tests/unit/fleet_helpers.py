"""Engines for unit tests of placement and admission: healthy, with clients that never connect;
a whole fleet of them with learned profiles, and a chat body."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from narwhal._narwhal_fast import Board
from narwhal.config import Config, EngineConfig
from narwhal.fleet.engine import Engine, Health
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.request.models import Catalog
from narwhal.scheduling.placement import Scheduler
from narwhal.upstream.client import EngineClient


def healthy_engines(configs: Iterable[EngineConfig]) -> list[Engine]:
    """One healthy Engine per config, indexed in order."""
    engines = []
    for i, cfg in enumerate(configs):
        engine = Engine(i, cfg, EngineClient(cfg.url))
        engine.health = Health.HEALTHY
        engines.append(engine)
    return engines


def fleet(config: Config) -> tuple[Catalog, list[Engine], Learning, Scheduler]:
    """The configuration's engines, healthy and profiled, with their catalog and scheduler."""
    catalog = Catalog(config)
    engines = []
    for i, cfg in enumerate(config.engines):
        engine = Engine(i, cfg, EngineClient(cfg.url), catalog.first_model(i))
        engine.health = Health.HEALTHY
        engines.append(engine)
    learning = Learning(engines, config)
    for learned in learning.learned.values():
        learned.prefill = PrefillModel(0.01, 1000.0)
    sched = Scheduler(engines, Board(engines=len(engines)), learning, predictive=True)
    return catalog, engines, learning, sched


def chat(model: str) -> bytes:
    """A small chat request body for ``model``."""
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 4})
