"""The simulator's timing model (FIFO prefill, batch decode steps, bursts) and its settings."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable

import pytest

from narwhal.sim.engine import TIMER_RESOLUTION, Engine
from narwhal.sim.settings import OutputLength, SimSettings

pytestmark = pytest.mark.timeout(30)


class Handle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    """What the scheduler uses of its event loop (``time``, ``call_at``, ``call_soon``) on a
    virtual clock, so the timings asserted are the model's and not a loaded host's. With a
    ``resolution``, timers fire on its ticks, as uvloop's do on whole milliseconds."""

    def __init__(self, resolution: float = 0.0) -> None:
        self.now = 0.0
        self.resolution = resolution
        self._timers: list[tuple[float, int, Handle]] = []
        self._order = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        if self.resolution:
            when = math.ceil(when / self.resolution - 1e-6) * self.resolution
        return self._push(max(when, self.now), callback)

    def call_soon(self, callback: Callable[[], None]) -> Handle:
        return self._push(self.now, callback)

    def _push(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle(callback)
        heapq.heappush(self._timers, (when, self._order, handle))
        self._order += 1
        return handle

    def _fire_next(self) -> None:
        when, _, handle = heapq.heappop(self._timers)
        self.now = max(self.now, when)
        if not handle.cancelled:
            handle.callback()

    def run_until(self, predicate: Callable[[], bool], limit: float = 60.0) -> None:
        while not predicate():
            assert self._timers and self._timers[0][0] <= limit, "nothing more happens"
            self._fire_next()

    def run_for(self, seconds: float) -> None:
        until = self.now + seconds
        while self._timers and self._timers[0][0] <= until:
            self._fire_next()
        self.now = until


class FakeJob:
    """Records when each of its tokens was produced."""

    def __init__(self, loop: VirtualLoop, prompt_tokens: int, tokens: int) -> None:
        self.loop = loop
        self.prompt_tokens = prompt_tokens
        self.tokens = tokens
        self.times: list[float] = []

    def advance(self) -> bool:
        self.times.append(self.loop.time())
        return len(self.times) >= self.tokens


def test_prefills_queue_fifo_and_add_up() -> None:
    loop = VirtualLoop()
    s = SimSettings(prefill_tokens_per_s=10000, prefill_overhead_ms=10, tpot_ms=5)
    engine = Engine(s, loop)  # type: ignore[arg-type]
    jobs = [FakeJob(loop, 500, 1) for _ in range(3)]  # 60 ms of prefill each
    for job in jobs:
        engine.submit(job)
    waiting = [engine.num_waiting]
    loop.run_until(lambda: all(j.times for j in jobs))
    waiting.append(engine.num_waiting)
    engine.close()
    assert waiting == [3, 0]
    assert [j.times for j in jobs] == [pytest.approx([0.06 * i]) for i in (1, 2, 3)]


def test_decode_step_grows_with_the_batch() -> None:
    loop = VirtualLoop()
    s = SimSettings(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, tpot_ms=20,
                    tpot_growth_ms=10)
    engine = Engine(s, loop)  # type: ignore[arg-type]
    a, b = FakeJob(loop, 1, 8), FakeJob(loop, 1, 8)
    engine.submit(a)
    engine.submit(b)
    loop.run_until(lambda: len(a.times) >= 3)
    running = engine.num_running
    loop.run_until(lambda: len(a.times) >= 8 and len(b.times) >= 8)
    engine.close()
    gaps = [y - x for x, y in zip(a.times[1:], a.times[2:], strict=False)]
    assert running == 2
    assert gaps == pytest.approx([0.030] * 6), gaps  # 20 ms + 10 ms x (2 - 1)


def test_sub_millisecond_steps_run_in_bursts_at_the_right_rate() -> None:
    loop = VirtualLoop(resolution=TIMER_RESOLUTION)
    s = SimSettings(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, tpot_ms=0.25)
    engine = Engine(s, loop)  # type: ignore[arg-type]
    job = FakeJob(loop, 1, 401)
    engine.submit(job)
    loop.run_until(lambda: len(job.times) >= 401)
    engine.close()
    # 400 steps x 0.25 ms = 100 ms, though timers fire only every 1 ms (one step per
    # firing would take 400 ms)
    assert job.times[-1] - job.times[0] == pytest.approx(0.1)


def test_abort_in_prefill_starts_the_next_and_counts_return_to_zero() -> None:
    loop = VirtualLoop()
    s = SimSettings(prefill_tokens_per_s=1000, prefill_overhead_ms=0, tpot_ms=1)
    engine = Engine(s, loop)  # type: ignore[arg-type]
    slow, fast = FakeJob(loop, 1000, 5), FakeJob(loop, 10, 5)  # 1 s, then 10 ms
    engine.submit(slow)
    engine.submit(fast)
    loop.run_for(0.01)
    engine.abort(slow)
    engine.abort(slow)  # idempotent
    loop.run_until(lambda: len(fast.times) >= 5)
    assert (engine.num_waiting, engine.num_running) == (0, 0)
    assert fast.times == pytest.approx([0.02, 0.021, 0.022, 0.023, 0.024]) and not slow.times


def test_output_length_specs() -> None:
    rng = random.Random(1)
    assert OutputLength("128").sample(rng) == 128
    draws = [OutputLength("uniform:16:256").sample(rng) for _ in range(2000)]
    assert min(draws) >= 16 and max(draws) <= 256
    draws = [OutputLength("geometric:64").sample(rng) for _ in range(4000)]
    assert min(draws) >= 1 and 55 <= sum(draws) / len(draws) <= 73
    for bad in ("", "x", "uniform:5", "uniform:9:3", "geometric:0", "0", "normal:3:4"):
        with pytest.raises(ValueError):
            OutputLength(bad)


def test_runtime_settings_update_is_all_or_nothing() -> None:
    s = SimSettings()
    s.update({"tpot_ms": 3, "output_len": "uniform:1:4"})
    assert s.tpot_ms == 3.0 and s.output_length.spec == "uniform:1:4"
    with pytest.raises(ValueError):
        s.update({"tpot_ms": 7, "prefill_tokens_per_s": -1})
    assert s.tpot_ms == 3.0 and s.prefill_tokens_per_s == 20000
    with pytest.raises(ValueError):
        s.update({"max_model_len": 5})
    with pytest.raises(ValueError):
        SimSettings(role="both")
