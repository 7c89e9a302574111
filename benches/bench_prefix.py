"""Benchmarks of the prefix index: Rust PrefixIndex against its Python oracle, same run.

One placement's work: probe a chat prompt (hash its 64-byte chunks, match them on each of 4
engines), then insert it on one. Run: ``pytest benches/bench_prefix.py``; ``test_ratio_gate``
(last) fails when the Rust path is less than 5x faster than the oracle on any case.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from narwhal._narwhal_fast import PrefixIndex
from reference import prefix_oracle

IMPLS: dict[str, Any] = {"rust": PrefixIndex, "oracle": prefix_oracle.PrefixIndex}
GATE = 5.0
MEDIANS: dict[tuple[str, str], float] = {}
SYSTEM = "You are a careful assistant for Narwhal's users; answer in short sentences. " * 24


def prompt(chars: int, conversation: int) -> str:
    """A system prompt shared by every conversation, then this conversation's turns."""
    turns = f"\x1euser\x1fturn of conversation {conversation}: tell me more. " * (chars // 40)
    return (SYSTEM + turns)[:chars]


@pytest.mark.parametrize("impl", ["rust", "oracle"])
@pytest.mark.parametrize("chars", [2_000, 8_000, 32_000])
def test_probe_and_insert(benchmark: Any, impl: str, chars: int) -> None:
    """Probe one prompt on 4 engines (each holding 200 others), insert it on one."""
    index = IMPLS[impl]([32_768] * 4, 64)
    for c in range(200):
        index.insert(c % 4, index.probe(prompt(chars, c)))
    text = prompt(chars, 7)
    assert index.probe(text).matched(3) == len(text.encode()) // 64

    def run() -> int:
        probe = index.probe(text)
        matched: int = max(probe.matched(e) for e in range(4))
        index.insert(3, probe)
        return matched

    benchmark(run)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        MEDIANS[(f"{chars} chars", impl)] = stats.stats.median


def test_ratio_gate(benchmark: Any) -> None:
    """Last in the file (see bench_stream.py)."""
    if not MEDIANS:
        pytest.skip("no benchmark statistics (benchmarks disabled or deselected)")

    def ratios() -> tuple[list[str], list[str]]:
        lines, slow = [], []
        for case in sorted({case for case, _ in MEDIANS}, key=lambda c: int(c.split()[0])):
            rust, oracle = MEDIANS.get((case, "rust")), MEDIANS.get((case, "oracle"))
            if rust is None or oracle is None:
                continue
            lines.append(f"{case:>12}: rust {rust * 1e6:8.2f} us, oracle {oracle * 1e6:9.1f} us,"
                         f" {oracle / rust:6.1f}x")
            if oracle / rust < GATE:
                slow.append(case)
        return lines, slow

    lines, slow = benchmark.pedantic(ratios, rounds=1, iterations=1)
    print("\n" + "\n".join(lines))
    assert lines and not slow, f"Rust path under {GATE}x the oracle: {slow}"
