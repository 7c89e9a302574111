"""The FIFO admission queue: requests wait here for a prefill slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from narwhal._narwhal_fast import Ticket
from narwhal.errors import Refusal
from narwhal.request.deadlines import Deadlines
from narwhal.scheduling.placement import Placement, Scheduler


class AdmissionQueue:
    """FIFO of requests waiting for placement; woken when a slot frees, never polled."""

    def __init__(self, scheduler: Scheduler, queue_limit: int, max_wait_s: float):
        self.scheduler = scheduler
        self.queue_limit = queue_limit
        self.max_wait_s = max_wait_s
        self.waiters: deque[asyncio.Future[Placement]] = deque()
        self.notify_peers: Callable[[], None] | None = None  # other workers' queues

    async def place(self, ticket: Ticket, deadlines: Deadlines) -> tuple[Placement, float]:
        """A placement (holding a prefill slot) and the seconds spent waiting for it."""
        if not self.waiters:
            placement = self.scheduler.try_place()
            if placement is not None:
                return placement, 0.0
        if not ticket.enqueue(self.queue_limit):
            raise Refusal("queue_full")
        loop = asyncio.get_running_loop()
        start = loop.time()
        wait_until = start + self.max_wait_s
        code = "admission_wait_expired"
        if deadlines.headers_by <= wait_until:
            wait_until, code = deadlines.headers_by, "deadline_expired"
        future: asyncio.Future[Placement] = loop.create_future()
        self.waiters.append(future)
        timer = loop.call_later(max(0.0, wait_until - start), _expire, future)
        try:
            placement = await future
        except TimeoutError:
            raise Refusal(code) from None
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.scheduler.release(future.result())  # placed as we were cancelled
            raise
        finally:
            timer.cancel()
            ticket.dequeue()
            if not future.done():
                future.cancel()
            placed = future.done() and not future.cancelled() and future.exception() is None
            if not placed:  # kick() pops what it places; remove() would format a repr to fail
                with contextlib.suppress(ValueError):
                    self.waiters.remove(future)
        return placement, loop.time() - start

    def capacity_freed(self) -> None:
        """A slot of this worker was released: place local waiters, and wake the peers."""
        self.kick()
        if self.notify_peers is not None:
            self.notify_peers()

    def kick(self) -> None:
        """Capacity may have freed: place waiting requests, oldest first."""
        waiters = self.waiters
        while waiters:
            head = waiters[0]
            if head.done():
                waiters.popleft()
                continue
            placement = self.scheduler.try_place()
            if placement is None:
                return
            waiters.popleft()
            head.set_result(placement)


def _expire(future: asyncio.Future[Placement]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
