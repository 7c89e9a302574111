"""A background loop's round that swallows its cancellation, as a library under it can
(``asyncio.wait_for`` on CPython 3.11, redis-py), and stopping the loop during one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Round:
    """A loop's round that swallows the cancellation it receives and returns normally."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.count = 0
        self.swallowed = 0

    async def __call__(self, *_: Any) -> None:
        self.count += 1
        self.running.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.swallowed += 1
        finally:
            self.running.clear()


async def stop_in_a_round(round_: Round, stop: Callable[[], Awaitable[None]]) -> None:
    """Stop while a round of the background loop (not the first, which ``start`` may run
    itself) is under way; the stop must end, and the round must have swallowed the cancel."""
    while round_.count < 2 or not round_.running.is_set():
        await asyncio.sleep(0.001)
    stopping = asyncio.ensure_future(stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert done, "the loop went on after its cancellation was swallowed"
    assert round_.swallowed == 1
