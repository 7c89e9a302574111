"""Projected engine load: the prefill chain, decode correction, the router queue's spread."""

from __future__ import annotations

import pytest

from narwhal.learning.occupancy import (
    SWEEP_SLACK,
    Demand,
    EngineLoad,
    PendingBook,
    Track,
    water_level,
)


def track(tokens: int, placed_at: float, cost_s: float) -> Track:
    return Track(Demand(tokens), 0, None, placed_at, cost_s, cost_s)


def test_prefill_chain_adds_up_placed_work() -> None:
    load = EngineLoad()
    for _ in range(3):
        load.place(track(100, 10.0, 0.5))
    assert load.prefill_wait(10.0) == pytest.approx(1.5)
    assert load.prefill_wait(10.4) == pytest.approx(1.1)
    assert load.prefill_inflight() == 3


def test_a_prefill_running_late_is_assumed_to_end_now() -> None:
    load = EngineLoad()
    load.place(track(100, 10.0, 0.5))
    load.place(track(100, 10.0, 0.5))
    # at 10.8 the first should be done but has not produced its first token
    assert load.prefill_wait(10.8) == pytest.approx(0.5)


def test_first_token_moves_to_decode_and_reanchors_the_chain() -> None:
    load = EngineLoad()
    a, b = track(100, 10.0, 0.5), track(100, 10.0, 0.5)
    load.place(a)
    load.place(b)
    service = load.first_token(a, 10.7, expected=20.0)  # a ran 0.2 s late
    assert service == pytest.approx(0.7)
    assert load.decoding() == 1
    assert load.prefill_wait(10.7) == pytest.approx(0.5)  # b starts when a finished
    service_b = load.first_token(b, 11.1, expected=20.0)
    assert service_b == pytest.approx(0.4)  # timed from a's first token, not from placement
    load.release(a, 12.0)
    load.release(a, 12.0)  # idempotent
    assert load.decoding() == 1
    assert a.batch == pytest.approx((0.4 * 1 + 0.9 * 2) / 1.3)  # mean batch during a's decode


def test_released_or_abandoned_prefill_leaves_the_chain() -> None:
    load = EngineLoad()
    a, b = track(100, 10.0, 0.5), track(100, 10.0, 0.5)
    load.place(a)
    load.place(b)
    load.release(a, 10.1)
    assert load.prefill_wait(10.1) == pytest.approx(0.4)
    b.released = True  # e.g. a placement given back without a hook: dropped lazily
    assert load.prefill_wait(10.1) == pytest.approx(0.4)  # the chain's end is cached 1 ms
    assert load.prefill_wait(10.2) == 0.0
    assert load.prefill == []


def test_decode_load_is_corrected_as_tokens_arrive() -> None:
    load = EngineLoad()
    t = track(10, 0.0, 0.1)
    load.place(t)
    load.first_token(t, 0.1, expected=100.0)
    assert load.decode_load(1.0, lambda tr: 100.0) == pytest.approx(100.0)
    t.tokens = 60
    assert load.decode_load(2.0, lambda tr: max(100.0, tr.tokens + 1.0)) == pytest.approx(40.0)
    t.tokens = 150  # longer than expected: the correction says at least one more
    assert load.decode_load(3.0, lambda tr: tr.tokens + 1.0) == pytest.approx(1.0)
    load.release(t, 3.0)
    assert load.decode_load(3.001, lambda tr: 0.0) == 0.0


def test_pending_book_keeps_fifo_order_and_totals() -> None:
    book = PendingBook()
    a, b, c = (Demand(n, book=book) for n in (10, 20, 30))
    with a, b:
        c.__enter__()
        assert (book.count, book.tokens) == (3, 60)
        assert book.head() is a
        book.discard(a)  # placed
        assert book.head() is b
        book.discard(c)
        assert (book.count, book.tokens) == (1, 20)
    assert (book.count, book.tokens) == (0, 0)
    assert book.head() is None


def test_water_level_spreads_queued_requests_over_engines_as_they_free_up() -> None:
    assert water_level([(1.0, 1.0)], 0) == 0.0
    assert water_level([(1.0, 1.0)], 2) == pytest.approx(3.0)  # one engine: 2 more seconds
    # two engines, one busy for 2 s: the idle one takes work until the busy one frees up
    assert water_level([(0.0, 1.0), (2.0, 1.0)], 1) == pytest.approx(1.0)
    assert water_level([(0.0, 1.0), (2.0, 1.0)], 4) == pytest.approx(3.0)
    # a faster engine takes more of the queue
    assert water_level([(0.0, 3.0), (0.0, 1.0)], 8) == pytest.approx(2.0)


def test_the_pending_book_stays_bounded_by_what_waits() -> None:
    """Every request passes through the book (``with demand:``); placed at once, it must not
    stay in the queue (a soak's memory grew by one Demand per request when only ``head()``
    removed them), and one old demand still waiting must not pin every later one."""
    book = PendingBook()
    old = Demand(10, book=book)
    old.__enter__()
    for _ in range(5000):
        with Demand(7, book=book):
            pass
    assert book.count == 1 and book.tokens == 10
    assert len(book._queue) <= 2 * book.count + SWEEP_SLACK + 1
    assert book.head() is old
    old.__exit__(None, None, None)
    assert book.count == 0 and len(book._queue) == 0 and book.head() is None
