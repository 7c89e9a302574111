"""Background tasks: stopping one whose cancellation may be lost under it.

A cancellation can be swallowed below a task's own code: ``asyncio.wait_for`` on CPython
3.11 returns the result when the awaited call completes in the same loop turn as the
cancellation, and redis-py can finish the command it was cancelled in and return normally.
Awaiting such a task after one ``cancel()`` would then wait forever, and the process would
not stop on SIGTERM. So a background loop also checks a stop flag of its own at every turn,
and its owner waits for it through :func:`stop_task`, bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_task(task: asyncio.Task[Any], timeout_s: float) -> bool:
    """Cancel ``task`` and wait, at most ``timeout_s``, for it to end (cancelled, returned or
    failed: its exception is retrieved, not raised). False when it is still running."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        return False
    if not task.cancelled():
        task.exception()  # retrieved: a failure at stop is not reported as never retrieved
    return True
