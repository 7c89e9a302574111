"""The end-to-end benchmarks' test bed: two simulated engines and Narwhal in front of them.

A bench module wraps :func:`running_bed` in its own fixture (``benches/conftest.py``
belongs to the stream micro-benchmarks).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import measure, systems
from .measure import Phase

# Short answers from fast engines keep a round near a tenth of a second; the engines still
# pace the stream (TTFT and ITL are theirs), so direct and Narwhal differ by the router only.
BENCH_SIM = systems.SimSettings(ttft_ms=5, tpot_ms=1.0, tokens=64)


class Bed:
    """Running engines and router, and the figures measured so far in this session."""

    def __init__(self, engines: list[systems.Proc], narwhal: systems.System) -> None:
        self.engines = engines
        self.systems = {
            "direct": systems.direct([e.url for e in engines]),
            "narwhal": narwhal,
        }
        self.results: dict[tuple[str, int], Phase] = {}

    def run(self, system: str, streams: int, answers: int) -> Phase:
        """``streams`` x ``answers`` streamed answers through ``system`` (one benchmark round)."""
        phase = measure.run_fixed(
            self.systems[system],
            [e.pid for e in self.engines],
            BENCH_SIM,
            streams=streams,
            answers=answers,
        )
        phase.system = system
        return phase


@contextlib.contextmanager
def running_bed() -> Iterator[Bed]:
    logdir = Path(tempfile.mkdtemp(prefix="narwhal-bench-"))
    engines = systems.start_engines(2, BENCH_SIM, logdir)
    try:
        narwhal = systems.start_narwhal("narwhal", [e.url for e in engines], 1, logdir)
        try:
            yield Bed(engines, narwhal)
        finally:
            narwhal.stop()
    finally:
        for e in engines:
            e.stop()
