"""server/eager.py: a handler's first step runs at once, and the task it starts behaves as
a task started the ordinary way (current task, context, result, error, cancellation)."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from typing import Any

import pytest
import uvloop

from narwhal.server import eager

STARTS = [pytest.param(eager._start_scheduled, False, id="scheduled")]
if sys.version_info >= (3, 11):
    STARTS.append(pytest.param(eager._start_eager_311, True, id="by-hand"))
if sys.version_info >= (3, 12):
    STARTS.append(pytest.param(eager._start_eager_312, True, id="eager_start"))

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def run(main: Any) -> Any:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_the_running_python_starts_handlers_eagerly_where_it_can() -> None:
    expected = eager._start_scheduled if sys.version_info < (3, 11) else (
        eager._start_eager_311 if sys.version_info < (3, 12) else eager._start_eager_312)
    assert eager.start_task is expected


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_first_step_runs_before_start_returns_and_the_task_resumes_at_its_wait(
        start: Any, is_eager: bool) -> None:
    seen: list[Any] = []

    async def handler(fut: asyncio.Future[int]) -> int:
        seen.append(("first", asyncio.current_task()))
        value = await fut
        seen.append(("after", asyncio.current_task(), value))
        return value * 2

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        task = start(loop, handler(fut))
        assert asyncio.current_task() is not task
        if is_eager:
            assert seen == [("first", task)]
        else:
            assert seen == []
        await asyncio.sleep(0)
        assert seen == [("first", task)]
        fut.set_result(21)
        assert await task == 42
        assert seen == [("first", task), ("after", task, 21)]

    run(main)


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_a_handler_that_never_waits_returns_its_value(start: Any, is_eager: bool) -> None:
    async def handler() -> str:
        return "done"

    async def main() -> None:
        task = start(asyncio.get_running_loop(), handler())
        assert await task == "done"

    run(main)


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_an_error_in_the_first_step_ends_the_task_with_it(start: Any, is_eager: bool) -> None:
    async def handler() -> None:
        raise ValueError("bad request")

    async def main() -> None:
        task = start(asyncio.get_running_loop(), handler())
        with pytest.raises(ValueError, match="bad request"):
            await task

    run(main)


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_cancelled_before_its_first_turn_the_handler_unwinds_from_its_wait(
        start: Any, is_eager: bool) -> None:
    unwound: list[str] = []

    async def handler(fut: asyncio.Future[None]) -> None:
        try:
            await fut
        except asyncio.CancelledError:
            unwound.append("cancelled")
            raise
        finally:
            unwound.append("finally")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waited: asyncio.Future[None] = loop.create_future()
        task = start(loop, handler(waited))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        # What it waited on is cancelled too, as a task cancels the future it waits on (a
        # queue that hands out places must not hand one to a request no longer waiting).
        assert waited.cancelled() == is_eager
        # A handler cancelled before it ever ran is closed without running (scheduled start).
        assert unwound == (["cancelled", "finally"] if is_eager else [])

    run(main)


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_the_handler_keeps_its_own_context(start: Any, is_eager: bool) -> None:
    async def handler(fut: asyncio.Future[None]) -> str:
        VAR.set("handler")
        await fut
        return VAR.get()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        task = start(loop, handler(fut))
        assert VAR.get() == "unset"  # the first step's write stayed in the task's context
        fut.set_result(None)
        assert await task == "handler"
        assert VAR.get() == "unset"

    run(main)


@pytest.mark.parametrize(("start", "is_eager"), STARTS)
def test_started_from_inside_another_task_that_task_is_current_again(
        start: Any, is_eager: bool) -> None:
    async def handler() -> Any:
        return asyncio.current_task()

    async def main() -> None:
        outer = asyncio.current_task()
        task = start(asyncio.get_running_loop(), handler())
        assert asyncio.current_task() is outer
        assert await task is task

    run(main)
