"""Output-length learning: ratio to the requested maximum per route, decode correction."""

from __future__ import annotations

import random

import orjson
import pytest

from narwhal.learning.output_length import (
    DECAY,
    RATIO_BINS,
    LengthDistribution,
    OutputLengths,
    _Histogram,
)


def test_prior_before_any_measurement() -> None:
    dist = LengthDistribution()
    assert dist.expected(100) == pytest.approx(50.0)
    assert dist.expected(None) == pytest.approx(256.0)
    assert dist.describe()["samples"] == 0


def test_learns_the_ratio_of_output_to_max_tokens() -> None:
    dist = LengthDistribution()
    for _ in range(200):
        dist.observe(128, 32)  # always a quarter of the maximum
    assert dist.expected(128) == pytest.approx(32, rel=0.05)
    assert dist.expected(1000) == pytest.approx(250, rel=0.05)  # scales with the maximum
    described = dist.describe()["ratio_of_max"]
    assert described["samples"] == 200
    assert described["mean"] == pytest.approx(0.25, rel=0.02)
    assert described["p50"] == pytest.approx(0.25)


def test_decode_correction_conditions_on_tokens_generated() -> None:
    """Half the requests stop at 10% of max, half run to the max: a request past 10% is
    expected to run to the end; one at 0 tokens is expected to do the mean."""
    dist = LengthDistribution()
    for _ in range(100):
        dist.observe(100, 10)
        dist.observe(100, 100)
    assert dist.expected(100, 0) == pytest.approx(55, rel=0.05)
    assert dist.expected(100, 20) == pytest.approx(100, rel=0.01)
    assert dist.expected(100, 100) == 100
    # generated beyond everything ever seen: at least one more token, at most the max
    assert dist.expected(100, 99) == 100


def test_unbounded_lengths_use_absolute_tokens() -> None:
    dist = LengthDistribution()
    rng = random.Random(1)
    for _ in range(300):
        dist.observe(None, rng.choice((20, 40)))
    assert dist.expected(None) == pytest.approx(30, rel=0.1)
    assert dist.expected(None, 33) == pytest.approx(40, rel=0.1)
    assert dist.expected(None, 500) == 1000  # longer than anything seen: as long again


def test_forgets_an_old_workload() -> None:
    dist = LengthDistribution()
    for _ in range(300):
        dist.observe(100, 90)
    for _ in range(600):
        dist.observe(100, 10)
    assert dist.expected(100) < 20  # from 90: the old workload weighs under a tenth


def test_routes_are_separate_and_survive_json() -> None:
    lengths = OutputLengths()
    for _ in range(50):
        lengths.observe("chat", 64, 64)
        lengths.observe("completion", 64, 16)
    assert lengths.expected("chat", 64) > 60
    assert lengths.expected("completion", 64) < 20
    restored = OutputLengths()
    restored.load(orjson.loads(orjson.dumps(lengths.as_json())))
    assert restored.expected("chat", 64) == pytest.approx(lengths.expected("chat", 64))
    assert restored.describe() == lengths.describe()
    restored.load({"chat": {"ratio": {"weights": [1, 2]}}, "other": 5})  # ignored, not fatal
    assert restored.describe() == lengths.describe()


class _DecayingBins:
    """The oracle: every bin shrinks by DECAY at each sample, as the definition says."""

    def __init__(self, bins: int) -> None:
        self.weights = [0.0] * bins
        self.sums = [0.0] * bins

    def add(self, index: int, value: float) -> None:
        self.weights = [w * DECAY for w in self.weights]
        self.sums = [v * DECAY for v in self.sums]
        self.weights[index] += 1.0
        self.sums[index] += value

    def conditional(self, index: int) -> float:
        weight = sum(self.weights[index:])
        return sum(self.sums[index:]) / weight if weight > 0 else 0.0


@pytest.mark.parametrize("samples", [50, 70_000])  # the larger passes a rescale
def test_lazy_forgetting_matches_shrinking_every_bin(samples: int) -> None:
    rng = random.Random(samples)
    fast, oracle = _Histogram(RATIO_BINS), _DecayingBins(RATIO_BINS)
    for n in range(samples):
        index = rng.randrange(RATIO_BINS) if n % 1000 else RATIO_BINS - 1
        value = (index + rng.random()) / RATIO_BINS
        fast.add(index, value)
        oracle.add(index, value)
    assert fast.weights == pytest.approx(oracle.weights, rel=1e-9, abs=1e-300)
    assert fast.sums == pytest.approx(oracle.sums, rel=1e-9, abs=1e-300)
    assert fast.total() == pytest.approx(sum(oracle.weights), rel=1e-9)
    for index in range(RATIO_BINS):
        assert fast.conditional(index) == pytest.approx(oracle.conditional(index), rel=1e-9)
    restored = _Histogram(RATIO_BINS)
    restored.load(orjson.loads(orjson.dumps(fast.as_json())))
    assert restored.conditional(3) == pytest.approx(oracle.conditional(3), rel=1e-9)
