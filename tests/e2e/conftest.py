"""Shared real-process fixtures: two simulated engines and a router in front of them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from procs import Proc, router_config, start_router, start_sim


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Proc]]:
    sims = [
        start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "200000"),
        start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "200000"),
    ]
    try:
        yield sims
    finally:
        for s in sims:
            s.stop()


@pytest.fixture(scope="module")
def router(engines: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("router")
    proc = start_router(tmp, router_config([e.url for e in engines]))
    try:
        yield proc
    finally:
        proc.stop()
