"""A migrated stream's continuation waiting for a slot (``AdmissionQueue.place_urgent``): it
goes ahead of every queued request of its model, never onto the engine it left, lets the
queue go on past it when only that engine has room, and gives up at its time limit."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_helpers import chat, fleet

from narwhal._narwhal_fast import Board, Slot
from narwhal.admission.gate import AdmissionQueue
from narwhal.config import parse_config
from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.request.deadlines import Deadlines
from narwhal.request.models import Catalog
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler


def two_engines() -> tuple[AdmissionQueue, Board, list[Engine], tuple[Scheduler, Catalog]]:
    """Two engines of one request each, and the queue in front of them."""
    config = parse_config({"model": "m", "engines": [
        {"name": "a", "url": "http://127.0.0.1:9201", "max_prefill": 1, "max_decode": 1},
        {"name": "b", "url": "http://127.0.0.1:9202", "max_prefill": 1, "max_decode": 1}]})
    catalog, engines, _, sched = fleet(config)
    queue = AdmissionQueue(sched, queue_limit=10, max_wait_s=5.0)
    return queue, sched.board, engines, (sched, catalog)


def demand(sched: Scheduler, catalog: Catalog) -> Demand:
    return sched.demand(parse_request("chat", chat("m"), model=catalog.names), 10)


async def both_full_then_queued_then_urgent(
    queue: AdmissionQueue, board: Board, sched: Scheduler, catalog: Catalog, left: Engine,
) -> tuple[list[Slot], asyncio.Future[Any], asyncio.Future[Any]]:
    """Both engines' slots held; a request queued; then a continuation that left ``left``
    waiting for a slot. Returns the held slots, the queued placement and the urgent one."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop.time() + 5, loop.time() + 5)
    held = [board.acquire_slot(0, "prefill", 1), board.acquire_slot(1, "prefill", 1)]
    assert held[0] is not None and held[1] is not None
    ticket, _ = board.arrive(100)
    queued = asyncio.ensure_future(queue.place(ticket, deadlines, demand(sched, catalog)))
    await asyncio.sleep(0)
    urgent = asyncio.ensure_future(queue.place_urgent(demand(sched, catalog), left,
                                                      loop.time() + 5))
    await asyncio.sleep(0)
    return [h for h in held if h is not None], queued, urgent


def test_a_continuation_goes_first_and_never_to_the_engine_it_left() -> None:
    queue, board, engines, (sched, catalog) = two_engines()
    a, b = engines

    async def main() -> None:
        held, queued, urgent = await both_full_then_queued_then_urgent(queue, board, sched,
                                                                       catalog, a)
        # a frees first: only the queued request may take it (the continuation left a).
        held[0].release()
        queue.kick()
        await asyncio.sleep(0)
        assert queued.done() and not urgent.done()
        placed, _ = queued.result()
        assert placed.engine is a
        # b frees: the continuation takes it.
        held[1].release()
        queue.kick()
        placement = await asyncio.wait_for(urgent, 1)
        assert placement is not None and placement.engine is b
        sched.release(placement)
        sched.release(placed)
        assert queue.queues == {}

    asyncio.run(main())


def test_a_continuation_is_first_in_line_and_gives_up_at_its_limit() -> None:
    queue, board, engines, (sched, catalog) = two_engines()
    a, _ = engines

    async def main() -> None:
        held, queued, urgent = await both_full_then_queued_then_urgent(queue, board, sched,
                                                                       catalog, a)
        held[1].release()  # b frees: the continuation, queued later, goes first
        queue.kick()
        placement = await asyncio.wait_for(urgent, 1)
        assert placement is not None and placement.engine.name == "b"
        assert not queued.done()
        sched.release(placement)
        queue.kick()
        got, _ = await asyncio.wait_for(queued, 1)
        sched.release(got)
        # Nothing frees off a within the limit: None, and the queue is left clean.
        until = asyncio.get_running_loop().time() + 0.1
        again = await queue.place_urgent(demand(sched, catalog), engines[1], until)
        assert again is None
        assert queue.queues == {}
        held[0].release()

    asyncio.run(main())
