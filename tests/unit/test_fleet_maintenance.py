"""Maintenance waves and drain: which engines stop taking placements, and whole-wave state."""

from __future__ import annotations

import pytest

from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine
from narwhal.fleet.engine import Health as State
from narwhal.fleet.maintenance import Maintenance, UnknownWave
from narwhal.upstream.client import EngineClient


def fleet() -> tuple[list[Engine], Maintenance, list[str]]:
    engines = []
    for i, wave in enumerate(["a", "a", "b"]):
        cfg = EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", wave=wave)
        engine = Engine(i, cfg, EngineClient(cfg.url))
        engine.health = State.HEALTHY
        engines.append(engine)
    changed: list[str] = []
    return engines, Maintenance(engines, lambda e: changed.append(e.name)), changed


def test_one_wave_drains_its_engines_only() -> None:
    engines, m, changed = fleet()
    m.set(m.resolve(["a"]), True)
    assert [e.state for e in engines] == ["maintenance", "maintenance", "healthy"]
    assert [e.serves() for e in engines] == [False, False, True]
    assert not m.whole and changed == ["e0", "e1"]
    m.set(m.resolve(["a"]), False)
    assert all(e.serves() for e in engines) and changed == ["e0", "e1", "e0", "e1"]


@pytest.mark.parametrize("waves", [["*"], ["a", "b"], ["b", "*"]])
def test_every_wave_is_whole_wave_maintenance(waves: list[str]) -> None:
    engines, m, _ = fleet()
    m.set(m.resolve(waves), True)
    assert m.whole and not any(e.serves() for e in engines)


def test_star_then_one_wave_off_leaves_the_others_in() -> None:
    engines, m, _ = fleet()
    m.set(m.resolve(["*"]), True)
    m.set(m.resolve(["b"]), False)
    assert not m.whole and m.describe()["waves"] == ["a"]
    assert [e.serves() for e in engines] == [False, False, True]
    m.set(m.resolve(["*"]), False)
    assert all(e.serves() for e in engines) and m.describe()["waves"] == []


def test_waves_built_up_one_by_one_become_whole() -> None:
    _, m, _ = fleet()
    m.set(m.resolve(["a"]), True)
    assert not m.whole
    m.set(m.resolve(["b"]), True)
    assert m.whole


def test_unknown_wave_names_its_index() -> None:
    _, m, _ = fleet()
    with pytest.raises(UnknownWave) as info:
        m.resolve(["a", "nope"])
    assert info.value.index == 1 and info.value.wave == "nope"


def test_drain_one_engine() -> None:
    engines, m, changed = fleet()
    m.drain(engines[2], True)
    m.drain(engines[2], True)  # idempotent: one change
    assert engines[2].state == "draining" and not engines[2].serves()
    assert changed == ["e2"] and m.describe()["draining"] == ["e2"]
    m.drain(engines[2], False)
    assert engines[2].serves()
