"""The admission queue: requests wait here for a prefill slot, first in first out for each
model (or adapter), so one model's full engines never hold up another's requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from narwhal._narwhal_fast import Ticket
from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.request.deadlines import Deadlines
from narwhal.request.models import Served
from narwhal.scheduling.placement import Placement, Scheduler

Waiter = tuple[int, "asyncio.Future[Placement]", "Demand | None", "Engine | None"]
"""(arrival order, the future placed into, what the request asks, an engine it must not be
placed on)."""
URGENT_RETRY_S = 0.05
"""A continuation waiting for a slot also looks again this often (a slot freed in another
worker wakes this one only while some request is queued on the board)."""


class AdmissionQueue:
    """Requests waiting for placement, a FIFO per model; woken when a slot frees, never
    polled. With several models waiting, the oldest head that can be placed goes first."""

    def __init__(self, scheduler: Scheduler, queue_limit: int, max_wait_s: float):
        self.scheduler = scheduler
        self.queue_limit = queue_limit
        self.max_wait_s = max_wait_s
        self.queues: dict[Served | None, deque[Waiter]] = {}  # by model; none empty
        self.notify_peers: Callable[[], None] | None = None  # other workers' queues
        self._arrivals = 0
        self._urgent = 0  # continuations wait with orders below every arrival's

    async def place(self, ticket: Ticket, deadlines: Deadlines,
                    demand: Demand | None = None) -> tuple[Placement, float]:
        """A placement (holding a prefill slot) and the seconds spent waiting for it."""
        key = None if demand is None else demand.served
        waiters = self.queues.get(key)
        if not waiters:
            placement = self.scheduler.try_place(demand=demand)
            if placement is not None:
                return placement, 0.0
        if demand is not None:
            demand.eligible = None  # what was eligible on arrival is stale once it waits
        if not ticket.enqueue(self.queue_limit):
            raise Refusal("queue_full")
        loop = asyncio.get_running_loop()
        start = loop.time()
        wait_until = start + self.max_wait_s
        code = "admission_wait_expired"
        if deadlines.headers_by <= wait_until:
            wait_until, code = deadlines.headers_by, "deadline_expired"
        future: asyncio.Future[Placement] = loop.create_future()
        if waiters is None:
            waiters = self.queues[key] = deque()
        self._arrivals += 1
        waiter = (self._arrivals, future, demand, None)
        waiters.append(waiter)
        if self.notify_peers is not None:
            # A peer's release between the failed try above and this enqueue saw nobody
            # queued and woke no one: look again now that the board counts this request.
            self.kick()
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
                    waiters.remove(waiter)
            if not waiters and self.queues.get(key) is waiters:
                del self.queues[key]
        return placement, loop.time() - start

    async def place_urgent(self, demand: Demand, exclude: Engine, until: float
                           ) -> Placement | None:
        """A placement for an answer already under way (a migrated stream's continuation),
        ahead of every queued request of its model and never on ``exclude``; None when no
        engine had room by the loop time ``until``."""
        placement = self.scheduler.try_place(exclude=exclude, demand=demand)
        if placement is not None:
            return placement
        demand.eligible = None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Placement] = loop.create_future()
        key = demand.served
        waiters = self.queues.get(key)
        if waiters is None:
            waiters = self.queues[key] = deque()
        self._urgent -= 1
        waiter = (self._urgent, future, demand, exclude)
        waiters.appendleft(waiter)
        try:
            while not future.done() and loop.time() < until:
                await asyncio.wait((future,), timeout=min(URGENT_RETRY_S,
                                                          max(0.0, until - loop.time())))
                if not future.done():
                    self.kick()
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.scheduler.release(future.result())
            raise
        finally:
            if not future.done():
                future.cancel()
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
            if not waiters and self.queues.get(key) is waiters:
                del self.queues[key]
        return future.result() if not future.cancelled() else None

    def capacity_freed(self) -> None:
        """A slot of this worker was released: place local waiters, and wake the peers when
        any request waits anywhere (a lock-free read of the board: no wake-up write per
        release while nobody queues)."""
        self.kick()
        if self.notify_peers is not None and self.scheduler.board.queued():
            self.notify_peers()

    def kick(self) -> None:
        """Capacity may have freed: place waiting requests, oldest first."""
        queues = self.queues
        if len(queues) == 1:  # one model waiting: its FIFO until a request cannot be placed
            for key, waiters in queues.items():
                self._place_from(waiters)
                if not waiters:
                    del queues[key]
                return
        blocked: set[Served | None] = set()
        while True:
            oldest: deque[Waiter] | None = None
            for key, waiters in queues.items():
                while waiters and waiters[0][1].done():
                    waiters.popleft()
                if waiters and key not in blocked and (oldest is None
                                                       or waiters[0][0] < oldest[0][0]):
                    oldest = waiters
            if oldest is None:
                break
            _, head, demand, exclude = oldest[0]
            placement = self.scheduler.try_place(exclude, demand)
            if placement is None:
                blocked.add(None if demand is None else demand.served)
                continue
            oldest.popleft()
            head.set_result(placement)
        for key in [key for key, waiters in queues.items() if not waiters]:
            del queues[key]

    def _place_from(self, waiters: deque[Waiter]) -> None:
        skipped: list[Waiter] = []  # continuations only the engine they left could take
        while waiters:
            waiter = waiters[0]
            _, head, demand, exclude = waiter
            if head.done():
                waiters.popleft()
                continue
            placement = self.scheduler.try_place(exclude, demand)
            if placement is None:
                if exclude is None:
                    break
                skipped.append(waiters.popleft())
                continue
            waiters.popleft()
            head.set_result(placement)
        waiters.extendleft(reversed(skipped))


def _expire(future: asyncio.Future[Placement]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
