"""The supervisor's loop on the running Python: it outlives its tick timeouts, a cancellation
that lands as a wait completes still ends it, and ``stop`` is bounded."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine, Health
from narwhal.learning import supervisor as supervision
from narwhal.learning.learned import EngineLearned
from narwhal.learning.output_length import OutputLengths
from narwhal.learning.supervisor import Supervisor, sleep_or_wake
from narwhal.upstream.client import EngineClient

LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [
    asyncio.new_event_loop, uvloop.new_event_loop]


def run(main: Callable[[], Awaitable[Any]], new_loop: Callable[[], asyncio.AbstractEventLoop]
        ) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def refused_url() -> str:
    """A loopback URL nothing listens on: every connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def supervisor(*urls: str) -> Supervisor:
    learned = {}
    for i, url in enumerate(urls):
        cfg = EngineConfig(name=f"e{i}", url=url)
        engine = Engine(i, cfg, EngineClient(cfg.url))
        engine.health = Health.HEALTHY
        learned[i] = EngineLearned(engine)
    return Supervisor(learned, OutputLengths(), lambda engine: None, model="m")


def loop_task() -> asyncio.Task[Any]:
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "learning"]
    return task


@pytest.mark.parametrize("new_loop", LOOPS, ids=["asyncio", "uvloop"])
def test_the_loop_outlives_its_tick_timeouts(
    monkeypatch: pytest.MonkeyPatch, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """Retries of a failing profile come only from ticks that time out (nothing wakes the
    loop once the retry is due): several retries mean the loop went through several
    timeouts. Before the fix, on 3.10 the first one killed it (asyncio.TimeoutError)."""
    monkeypatch.setattr(supervision, "TICK_S", 0.05)
    monkeypatch.setattr(supervision, "BACKOFF_S", (0.01, 0.01))

    async def main() -> None:
        sup = supervisor(refused_url())
        await sup.start(wait=False)
        task = loop_task()
        learned = sup.learned[0]
        try:
            deadline = time.monotonic() + 10.0
            while learned.failures < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert learned.failures >= 4, learned.error
            assert learned.error is not None and learned.error.startswith("engine_error")
            assert not task.done()
        finally:
            await sup.stop()
            await learned.engine.client.close()
        assert task.cancelled()

    run(main, new_loop)


@pytest.mark.parametrize("new_loop", LOOPS, ids=["asyncio", "uvloop"])
def test_a_cancellation_as_the_wait_completes_is_not_dropped(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The wake and the cancellation in one loop iteration: the wait has completed when the
    task resumes. ``wait_for`` on 3.11 returns normally there and the task runs on."""

    async def main() -> None:
        event = asyncio.Event()
        waiting = asyncio.get_running_loop().create_task(sleep_or_wake(event, 60.0))
        await asyncio.sleep(0)  # now waiting on the event
        event.set()
        waiting.cancel()
        await asyncio.wait([waiting], timeout=5.0)
        assert waiting.cancelled()

    run(main, new_loop)


@pytest.mark.parametrize("new_loop", LOOPS, ids=["asyncio", "uvloop"])
def test_stop_right_after_a_wake_ends_the_loop(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The shutdown race itself: something wakes the supervisor (drift, a health change, a
    finished profile) in the same iteration as ``stop`` cancels it. Before the fix, on 3.11
    the loop swallowed the cancellation and ``stop`` waited for it forever."""

    async def main() -> None:
        sup = supervisor()
        await sup.start(wait=False)
        task = loop_task()
        await asyncio.sleep(0.01)  # the loop is in its wait
        sup.wake()
        stopping = asyncio.get_running_loop().create_task(sup.stop())
        await asyncio.wait([stopping], timeout=supervision.STOP_WAIT_S + 5.0)
        assert stopping.done() and stopping.exception() is None
        assert task.cancelled()

    run(main, new_loop)


class Stubborn:
    """A profiler whose profile ignores cancellation for a while (a stand-in for any task
    that will not stop)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def profile(self, *args: object) -> None:
        self.started.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                continue


def test_stop_is_bounded_and_names_what_did_not_stop(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sup = supervisor(refused_url())
        stubborn = Stubborn()
        sup.profiler = stubborn  # type: ignore[assignment]
        await sup.start(wait=False)
        await asyncio.wait_for(stubborn.started.wait(), 5.0)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="narwhal.learning"):
            await sup.stop()
        took = time.monotonic() - started
        stubborn.release.set()
        await asyncio.sleep(0.01)
        assert took < supervision.STOP_WAIT_S + 1.0
        assert "profile e0 did not stop" in caplog.text
        assert loop_task_gone()

    def loop_task_gone() -> bool:
        return not [t for t in asyncio.all_tasks() if t.get_name() == "learning"]

    run(main, uvloop.new_event_loop)
