"""The simulator's timing model (FIFO prefill, batch decode steps, bursts) and its settings."""

from __future__ import annotations

import asyncio
import random

import pytest

from narwhal.sim.engine import Engine
from narwhal.sim.settings import OutputLength, SimSettings

pytestmark = pytest.mark.timeout(30)


class FakeJob:
    """Records when each of its tokens was produced."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt_tokens: int, tokens: int) -> None:
        self.loop = loop
        self.prompt_tokens = prompt_tokens
        self.tokens = tokens
        self.times: list[float] = []

    def advance(self) -> bool:
        self.times.append(self.loop.time())
        return len(self.times) >= self.tokens


async def _until(predicate: object, limit: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not predicate() and asyncio.get_running_loop().time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.002)


def test_prefills_queue_fifo_and_add_up() -> None:
    async def go() -> tuple[list[float], list[int]]:
        loop = asyncio.get_running_loop()
        s = SimSettings(prefill_tokens_per_s=10000, prefill_overhead_ms=10, tpot_ms=5)
        engine = Engine(s, loop)
        start = loop.time()
        jobs = [FakeJob(loop, 500, 1) for _ in range(3)]  # 60 ms of prefill each
        for job in jobs:
            engine.submit(job)
        waiting = [engine.num_waiting]
        await _until(lambda: all(j.times for j in jobs))
        waiting.append(engine.num_waiting)
        engine.close()
        return [j.times[0] - start for j in jobs], waiting

    firsts, waiting = asyncio.run(go())
    assert waiting == [3, 0]
    for i, t in enumerate(firsts, 1):
        assert 0.06 * i - 0.003 <= t <= 0.06 * i + 0.04, firsts


def test_decode_step_grows_with_the_batch() -> None:
    async def go() -> tuple[list[float], int]:
        loop = asyncio.get_running_loop()
        s = SimSettings(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, tpot_ms=20,
                        tpot_growth_ms=10)
        engine = Engine(s, loop)
        a, b = FakeJob(loop, 1, 8), FakeJob(loop, 1, 8)
        engine.submit(a)
        engine.submit(b)
        await _until(lambda: len(a.times) >= 3)
        running = engine.num_running
        await _until(lambda: len(a.times) >= 8 and len(b.times) >= 8)
        engine.close()
        return [y - x for x, y in zip(a.times[1:], a.times[2:], strict=False)], running

    gaps, running = asyncio.run(go())
    assert running == 2
    mean = sum(gaps) / len(gaps)
    assert 0.028 <= mean <= 0.040, gaps  # 20 ms + 10 ms x (2 - 1)


def test_sub_millisecond_steps_run_in_bursts_at_the_right_rate() -> None:
    async def go() -> float:
        loop = asyncio.get_running_loop()
        s = SimSettings(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, tpot_ms=0.25)
        engine = Engine(s, loop)
        job = FakeJob(loop, 1, 401)
        engine.submit(job)
        await _until(lambda: len(job.times) >= 401)
        engine.close()
        return job.times[-1] - job.times[0]

    elapsed = asyncio.run(go())
    assert 0.09 <= elapsed <= 0.3  # 400 steps x 0.25 ms = 100 ms


def test_abort_in_prefill_starts_the_next_and_counts_return_to_zero() -> None:
    async def go() -> tuple[int, int, bool]:
        loop = asyncio.get_running_loop()
        s = SimSettings(prefill_tokens_per_s=1000, prefill_overhead_ms=0, tpot_ms=1)
        engine = Engine(s, loop)
        slow, fast = FakeJob(loop, 1000, 5), FakeJob(loop, 10, 5)  # 1 s, then 10 ms
        engine.submit(slow)
        engine.submit(fast)
        await asyncio.sleep(0.01)
        engine.abort(slow)
        engine.abort(slow)  # idempotent
        await _until(lambda: len(fast.times) >= 5, 0.5)
        return engine.num_waiting, engine.num_running, len(fast.times) == 5 and not slow.times

    assert asyncio.run(go()) == (0, 0, True)


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
