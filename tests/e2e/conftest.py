"""Shared real-process fixtures: two simulated engines and a router in front of them; a check
that fails any test (or module) that leaves a router process running."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import procs
from procs import Proc, router_config, start_router, start_sim


def _check_routers(since: int) -> Iterator[None]:
    """Fail when a router started after ``ROUTERS[since]`` is still running, or any of its
    processes (workers included) outlived it; everything found is killed first."""
    yield
    problems = procs.routers_left_behind(procs.ROUTERS[since:])
    if problems:
        pytest.fail("router processes left behind:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def no_router_left_behind() -> Iterator[None]:
    """Routers a test (or its function-scoped fixtures) started."""
    yield from _check_routers(len(procs.ROUTERS))


@pytest.fixture(autouse=True, scope="module")
def no_module_router_left_behind() -> Iterator[None]:
    """Routers a module's fixtures started (checked after the module's last test)."""
    yield from _check_routers(len(procs.ROUTERS))


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
