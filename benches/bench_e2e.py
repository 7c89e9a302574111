"""End-to-end benchmarks: streamed chat through Narwhal and straight to the engines, one run.

Run: ``pytest benches --benchmark-only`` (or ``pytest benches/bench_e2e.py``). Each case
times a fixed amount of work, ``streams`` closed-loop streams of ``ANSWERS`` streamed answers
(64 tokens each) from two simulated engines, so ``--benchmark-compare`` can follow it across
commits. Narwhal's cases then assert the gates of ``benches/harness/gates.py``: ratios to the
direct case measured moments before on the same engines, which hold on any machine.
The full side-by-side report with the anchor routers is ``python -m benches.harness``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches.harness import gates, measure
from benches.harness.fixtures import Bed, running_bed

ANSWERS = {1: 4, 8: 4}  # answers per stream in one round
ROUNDS = 3


@pytest.fixture(scope="module")
def e2e_bed() -> Iterator[Bed]:
    with running_bed() as bed:
        yield bed


def _measure(benchmark: Any, bed: Bed, system: str, streams: int) -> measure.Phase:
    rounds: list[measure.Phase] = []

    def one_round() -> None:
        rounds.append(bed.run(system, streams, ANSWERS[streams]))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    measured = rounds[1:] or rounds  # the warm-up round opens connections and pools
    phase = measure.combine(measured)
    assert phase.errors == 0, phase.error_samples
    benchmark.extra_info.update(
        {
            "tokens_per_s": round(phase.tokens_per_s, 1),
            "ttft_p50_ms": round(phase.ttft_p50_ms, 3),
            "ttft_p99_ms": round(phase.ttft_p99_ms, 3),
            "itl_p50_ms": round(phase.itl_p50_ms, 3),
            "router_cpu_s_per_1k_tokens": round(phase.cpu_s_per_1k_tokens, 4),
            "client_cpu_s_per_1k_tokens": round(phase.client_cpu_s_per_1k_tokens, 4),
        }
    )
    bed.results[(system, streams)] = phase
    return phase


@pytest.mark.parametrize(
    ("system", "streams"), [("direct", 1), ("narwhal", 1), ("direct", 8), ("narwhal", 8)]
)
def test_stream(benchmark: Any, e2e_bed: Bed, system: str, streams: int) -> None:
    phase = _measure(benchmark, e2e_bed, system, streams)
    if system == "direct":
        return
    direct = e2e_bed.results.get(("direct", streams))
    if direct is None:  # the direct case was deselected: measure it now, unbenchmarked
        direct = measure.combine([e2e_bed.run("direct", streams, ANSWERS[streams])])
    checked = gates.check(direct, phase)
    print("\n" + "\n".join(str(g) for g in checked))
    failed = [str(g) for g in checked if not g.ok]
    assert not failed, failed
