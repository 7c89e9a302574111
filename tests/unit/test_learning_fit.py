"""The latency model's pieces: prefill least squares, TPOT spreading and model, drift."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.learning.drift import Drift
from narwhal.learning.latency import MAX_TOKENS_PER_S, FitError, PrefillModel, fit_prefill
from narwhal.learning.tpot import TpotModel, attempt_tpot, reads_tpot

# -- prefill fit --------------------------------------------------------------------------


def test_exact_points_give_the_exact_line() -> None:
    truth = PrefillModel(overhead_s=0.02, tokens_per_s=5000.0)
    model = fit_prefill([(n, truth.seconds(n)) for n in (16, 64, 256, 1024)])
    assert model.overhead_s == pytest.approx(0.02, rel=1e-9)
    assert model.tokens_per_s == pytest.approx(5000.0, rel=1e-9)


@settings(deadline=None)  # a GC pause or a preempted CI host is not a failure
@given(overhead=st.floats(0.0005, 0.2), rate=st.floats(500.0, 200_000.0),
       seed=st.integers(0, 2**32 - 1))
def test_noisy_points_stay_within_a_few_percent(overhead: float, rate: float, seed: int) -> None:
    """1% multiplicative noise on every probe: predictions stay within 5% at every length."""
    rng = random.Random(seed)
    lengths = (16, 64, 256, 1024, 2048)
    truth = PrefillModel(overhead, rate)
    points = [(n, truth.seconds(n) * rng.uniform(0.99, 1.01)) for n in lengths]
    model = fit_prefill(points)
    assert model.overhead_s >= 0
    for n in lengths:
        assert model.seconds(n) == pytest.approx(truth.seconds(n), rel=0.05, abs=1e-4)


def test_negative_intercept_refits_through_the_origin() -> None:
    model = fit_prefill([(100, 0.009), (1000, 0.1)])  # the line would cross below zero
    assert model.overhead_s == 0.0
    # weighted by 1/y^2 through the origin: slope = sum(x/y) / sum((x/y)^2)
    ratios = (100 / 0.009, 1000 / 0.1)
    assert 1.0 / model.tokens_per_s == pytest.approx(sum(ratios) / sum(r * r for r in ratios))


def test_no_growth_with_length_means_the_ceiling_rate() -> None:
    model = fit_prefill([(16, 0.010), (2048, 0.009)])
    assert model.tokens_per_s == MAX_TOKENS_PER_S
    assert 0.009 < model.overhead_s < 0.010


@pytest.mark.parametrize("points", [[], [(16, 0.01)], [(16, 0.01), (16, 0.02)],
                                    [(16, float("nan")), (64, 0.02)]])
def test_one_length_cannot_be_fitted(points: list[tuple[int, float]]) -> None:
    with pytest.raises(FitError):
        fit_prefill(points)


def test_model_json_round_trip_and_rejects_garbage() -> None:
    model = PrefillModel(0.01, 1234.5)
    assert PrefillModel.from_json(model.as_json()) == model
    for bad in (None, [], {"prefill_overhead_s": -1, "prefill_tokens_per_s": 5},
                {"prefill_overhead_s": 0.1, "prefill_tokens_per_s": 0},
                {"prefill_overhead_s": True, "prefill_tokens_per_s": 5},
                {"prefill_overhead_s": 0.1}):
        assert PrefillModel.from_json(bad) is None


# -- TPOT ---------------------------------------------------------------------------------


def test_a_read_with_k_tokens_spreads_its_gap_over_k() -> None:
    # first read: 1 token at t=0; then a read of 3 tokens at t=0.03 and 1 token at t=0.04
    reads = [(0.0, 1), (0.03, 3), (0.04, 1)]
    assert reads_tpot(reads) == pytest.approx(0.04 / 4)
    assert attempt_tpot(0.0, 0.04, 5, 1) == pytest.approx(0.01)
    # a first read carrying 2 tokens: only later tokens count
    assert attempt_tpot(1.0, 1.3, 5, 2) == pytest.approx(0.1)


@pytest.mark.parametrize("args", [(0.0, 0.0, 5, 1), (0.0, 1.0, 1, 1), (0.0, 1.0, 3, 3)])
def test_attempt_without_later_tokens_has_no_tpot(args: tuple[float, float, int, int]) -> None:
    assert attempt_tpot(*args) is None
    assert reads_tpot([(0.0, 1)]) is None


def test_tpot_model_is_an_ewma_at_one_batch_size() -> None:
    model = TpotModel()
    assert model.predict() is None
    model.observe(0.010)
    assert model.predict() == pytest.approx(0.010)
    for _ in range(150):
        model.observe(0.020)
    assert model.predict() == pytest.approx(0.020, rel=1e-3)
    assert model.growth_s == 0.0


def test_tpot_model_learns_growth_when_batches_vary() -> None:
    """Sim-like truth: 10 ms + 1 ms per extra request decoding."""
    model = TpotModel()
    rng = random.Random(7)
    for _ in range(200):
        batch = rng.uniform(1, 12)
        model.observe(0.010 + 0.001 * (batch - 1), batch)
    assert model.base_s == pytest.approx(0.010, rel=0.02)
    assert model.growth_s == pytest.approx(0.001, rel=0.02)
    assert model.predict(5) == pytest.approx(0.014, rel=0.02)


def test_profile_reset_restarts_from_the_measurement() -> None:
    model = TpotModel(0.010)
    for _ in range(10):
        model.observe(0.010)
    model.reset(0.030)
    assert model.predict() == pytest.approx(0.030)
    model.observe(float("nan"))
    model.observe(-1.0)
    assert model.predict() == pytest.approx(0.030)


# -- drift --------------------------------------------------------------------------------


def test_drift_is_zero_when_predictions_hold() -> None:
    drift = Drift(0.002)
    for _ in range(20):
        drift.observe(0.0101, 0.0100)
    assert drift.value == pytest.approx(0.01, rel=0.05)
    assert not drift.exceeds(0.5)


def test_one_outlier_is_not_drift_but_a_sustained_change_is() -> None:
    drift = Drift(0.002)
    drift.observe(1.0, 0.010)  # a 100x outlier counts as MAX_ERROR
    assert drift.value == pytest.approx(0.4)
    assert not drift.exceeds(0.5)
    for _ in range(3):
        drift.observe(0.010, 0.010)
    assert drift.value < 0.25
    for _ in range(3):
        drift.observe(0.030, 0.010)  # the engine got 3x slower
    assert drift.exceeds(0.5)
    drift.reset()
    assert (drift.value, drift.samples) == (0.0, 0)


def test_drift_floor_keeps_tiny_predictions_from_exploding() -> None:
    drift = Drift(0.02)
    drift.observe(0.004, 0.001)  # 3 ms of jitter on a 1 ms prediction
    assert drift.value == pytest.approx(0.2 * 0.003 / 0.02)
