"""Start a request's handler now, up to its first wait, instead of a loop turn later.

Under load a loop turn is every ready callback of the round (a millisecond and more at 64
streams, several at 256), and a request's handler that waits for it starts that much
later: its time to first token grows by the wait. CPython 3.12 starts a task eagerly on
request (``eager_start=True``). On 3.11 :func:`start_task` does the same by hand, as 3.12
does it: the task exists first and is the loop's current task while the coroutine runs
its first step, in the task's own context; the task then takes the coroutine over at the
wait it reached (:class:`_Resumed`). A cancellation that comes before the task's first
turn reaches the coroutine at that wait, as it would have reached it in the task.

3.10 keeps the scheduled start (its tasks take no context to run the first step in).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["start_task"]

_PENDING = object()  # no first step to hand over (any more)
_DONE = object()  # the first step ended the coroutine


class _Resumed:
    """A coroutine whose first step already ran, as the task that goes on driving it sees
    it: its first ``send`` gives back what that step yielded (the future the coroutine
    waits on) or ends as that step ended; after that every call goes to the coroutine."""

    __slots__ = ("_coro", "_error", "_first", "_result")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._first: Any = _PENDING
        self._result: Any = None
        self._error: BaseException | None = None

    def step(self) -> None:
        """Run the coroutine's first step."""
        try:
            self._first = self._coro.send(None)
        except StopIteration as stop:
            self._first, self._result = _DONE, stop.value
        except BaseException as exc:  # the task ends as the coroutine ended
            self._first, self._error = _DONE, exc

    def send(self, value: Any) -> Any:
        first = self._first
        if first is _PENDING:
            return self._coro.send(value)
        self._first = _PENDING
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if first is _DONE:
            raise StopIteration(self._result)
        return first

    def throw(self, *args: Any) -> Any:
        """The task throws only to cancel: before its first turn, the coroutine waits on the
        first step's future, which the task never saw, so it is cancelled here as the task
        cancels the future it waits on."""
        first, self._first = self._first, _PENDING
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if isinstance(first, asyncio.Future) and not first.done():
            first.cancel()
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        return self

    def __iter__(self) -> _Resumed:
        return self

    def __next__(self) -> Any:
        return self.send(None)


collections.abc.Coroutine.register(_Resumed)


def _start_scheduled(loop: asyncio.AbstractEventLoop,
                     coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    return loop.create_task(coro)


def _start_eager_312(loop: asyncio.AbstractEventLoop,
                     coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]


def _start_eager_311(loop: asyncio.AbstractEventLoop,
                     coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    context = contextvars.copy_context()
    resumed = _Resumed(coro)
    task: asyncio.Task[Any] = loop.create_task(resumed, context=context)
    enter, leave = asyncio.tasks._enter_task, asyncio.tasks._leave_task
    outer = asyncio.tasks.current_task(loop)
    if outer is not None:  # started from inside another task's step: swap, as 3.12 does
        leave(loop, outer)
    enter(loop, task)
    try:
        context.run(resumed.step)
    finally:
        leave(loop, task)
        if outer is not None:
            enter(loop, outer)
    return task


if sys.version_info >= (3, 12):
    start_task = _start_eager_312
elif sys.version_info >= (3, 11):
    start_task = _start_eager_311
else:
    start_task = _start_scheduled
