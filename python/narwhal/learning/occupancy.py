"""Projected engine load: prefill work placed on each engine, decode occupancy, router queue.

A :class:`Demand` is what one request asks of the fleet; while it waits for placement it is
in the :class:`PendingBook` (the router's queued prefill work). A :class:`Track` is one
attempt of a request on one engine, from placement to release: in the engine's prefill
chain until its first token, then in its decode book until it ends.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from narwhal._narwhal_fast import Slot
from narwhal.request.models import Served

DECODE_CACHE_S = 0.1
"""How long a computed decode load is reused (it is a tie-breaker; tracks enter and leave
it incrementally in between)."""
CHAIN_CACHE_S = 0.001
"""How long an unchanged prefill chain's end is reused (one admission and placement ask it
once per engine each; placement, first tokens and releases invalidate it)."""


class Demand:
    """One request's needs: prompt tokens, route, requested maximum, prompt-prefix key and
    the model it names.

    ``with demand:`` holds it in the pending book (queued prefill work) until it is placed
    or gives up.
    """

    __slots__ = ("_book", "cached_per_chunk", "eligible", "expected_output", "max_tokens",
                 "pending", "prefix", "probe", "prompt_tokens", "route", "served", "session",
                 "session_home")

    def __init__(self, prompt_tokens: int, route: str = "completion",
                 max_tokens: int | None = None, prefix: int | None = None,
                 book: PendingBook | None = None, served: Served | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.route = route
        self.max_tokens = max_tokens
        self.prefix = prefix
        self.served = served  # the model or adapter asked for (None: any engine)
        # The placement-eligible engines as the scheduler found them when this demand was
        # made, for admission and placement in the same instant (None: ask again).
        self.eligible: list[Any] | None = None
        self.expected_output = 0.0  # expected output tokens, when placement computed it
        self.pending = False
        self._book = book
        # Cache-aware projection (learning/prefix.py): the prompt's prefix probe (None: not
        # indexed), prompt tokens per indexed chunk, the session and its last engine.
        self.probe: Any = None
        self.cached_per_chunk = 0.0
        self.session: str | None = None
        self.session_home: tuple[int, int] | None = None

    def __enter__(self) -> Demand:
        if self._book is not None:
            self._book.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._book is not None:
            self._book.discard(self)


SWEEP_SLACK = 64
"""Demands no longer waiting a pending book keeps behind a waiting one before it sweeps."""


class PendingBook:
    """Demands waiting in the router's admission queue, oldest first, with running totals."""

    __slots__ = ("_queue", "count", "tokens")

    def __init__(self) -> None:
        self._queue: deque[Demand] = deque()
        self.count = 0
        self.tokens = 0

    def add(self, demand: Demand) -> None:
        if not demand.pending:
            demand.pending = True
            self._queue.append(demand)
            self.count += 1
            self.tokens += demand.prompt_tokens

    def discard(self, demand: Demand) -> None:
        """No longer waiting (placed, refused, expired or cancelled); idempotent. Demands no
        longer waiting leave the queue from its head; those behind an older one still waiting
        are swept out once they outnumber the waiting ones (the queue stays bounded by what
        waits, not by every request ever seen)."""
        if demand.pending:
            demand.pending = False
            self.count -= 1
            self.tokens -= demand.prompt_tokens
            queue = self._queue
            while queue and not queue[0].pending:
                queue.popleft()
            if len(queue) > 2 * self.count + SWEEP_SLACK:
                self._queue = deque(d for d in queue if d.pending)

    def head(self) -> Demand | None:
        """The oldest waiting demand: the one the FIFO queue places next."""
        queue = self._queue
        while queue and not queue[0].pending:
            queue.popleft()
        return queue[0] if queue else None


class Track:
    """One attempt of a request on one engine, from placement to release."""

    __slots__ = ("batch", "cached_tokens", "cost_s", "decode_at", "decode_integral", "demand",
                 "engine", "expected", "first_at", "first_loop", "first_tokens", "placed_at",
                 "predicted_prefill_s", "released", "remaining", "slot", "tokens")

    def __init__(self, demand: Demand, engine: int, slot: Slot | None, placed_at: float,
                 cost_s: float, predicted_prefill_s: float) -> None:
        self.demand = demand
        self.engine = engine  # the engine's index
        self.slot = slot  # its prefill slot (None for profiling probes)
        self.placed_at = placed_at  # time.monotonic()
        self.cost_s = cost_s  # predicted prefill time of this prompt alone
        self.predicted_prefill_s = predicted_prefill_s  # wait ahead + cost, at placement
        self.cached_tokens = 0  # prompt tokens the prefix index credited (not in cost_s)
        self.first_at: float | None = None  # time.monotonic() of the first token
        self.first_loop = 0.0  # the loop's time of the first token (the relay's clock)
        self.first_tokens = 0  # token IDs in the first read
        self.tokens = 0  # token IDs so far (the relay adds each read's count)
        self.decode_at = 0.0
        self.decode_integral = 0.0
        self.batch = 1.0  # mean requests decoding on the engine during this attempt
        self.expected = 0.0  # expected total output (decode correction)
        self.remaining = 0.0  # expected tokens still to come, as last counted
        self.released = False

    def in_prefill(self) -> bool:
        slot = self.slot
        return (not self.released and self.first_at is None
                and (slot is None or not slot.released))


class EngineLoad:
    """One engine's placed work in this process: its prefill chain and its decode book."""

    __slots__ = ("_chain_at", "_chain_end", "_chain_version", "_decode_at", "_decode_tokens",
                 "_integral", "_integral_at", "_version", "anchor", "decode", "prefill")

    def __init__(self) -> None:
        self.prefill: list[Track] = []  # in placement order
        self.anchor = -math.inf  # when the engine last finished a prefill (a first token)
        self.decode: dict[Track, None] = {}
        self._integral = 0.0  # time integral of the number of requests decoding
        self._integral_at = -math.inf
        self._decode_tokens = 0.0
        self._decode_at = -math.inf
        self._version = 0  # bumped whenever the prefill chain changes
        self._chain_version = -1
        self._chain_at = -math.inf
        self._chain_end = 0.0

    # -- prefill
    def place(self, track: Track) -> None:
        self.prefill.append(track)
        self._version += 1

    def prefill_wait(self, now: float) -> float:
        """Seconds until the prefill work placed on the engine is done (FIFO chain).

        Each placed prompt starts when the one before it finishes (or when it was placed,
        if later) and takes its predicted cost; a prefill running over its prediction is
        assumed to finish now. Attempts that left prefill without a hook (a placement
        given back) are dropped here.
        """
        chain = self.prefill
        if not chain:
            return 0.0
        if self._chain_version == self._version and 0.0 <= now - self._chain_at < CHAIN_CACHE_S:
            end = self._chain_end
        else:
            live = [t for t in chain if t.in_prefill()]
            if len(live) != len(chain):
                self.prefill = chain = live
            end = self.anchor
            for t in chain:
                start = t.placed_at if t.placed_at > end else end
                end = start + t.cost_s
                if end < now:
                    end = now
            self._chain_version, self._chain_at, self._chain_end = self._version, now, end
        return end - now if end > now else 0.0

    def prefill_inflight(self) -> int:
        return sum(1 for t in self.prefill if t.in_prefill())

    def first_token(self, track: Track, now: float, expected: float) -> float:
        """``track`` produced its first token: out of the chain, into decode. Returns the
        seconds the engine spent on it alone (since it was placed or since the previous
        prefill finished, whichever is later)."""
        service = now - max(track.placed_at, self.anchor)
        track.first_at = now
        self._drop_prefill(track)
        self.anchor = max(self.anchor, now)
        self._integrate(now)
        self.decode[track] = None
        track.decode_at, track.decode_integral = now, self._integral
        track.expected = expected
        track.remaining = max(0.0, expected - track.tokens)
        self._decode_tokens += track.remaining
        return service

    def release(self, track: Track, now: float) -> None:
        """The attempt is over (idempotent): out of the chain or the decode book."""
        if track.released:
            return
        track.released = True
        if track.first_at is None:
            self._drop_prefill(track)
            return
        if track in self.decode:
            self._integrate(now)
            del self.decode[track]
            span = now - track.decode_at
            if span > 0:
                track.batch = max(1.0, (self._integral - track.decode_integral) / span)
            else:
                track.batch = float(len(self.decode) + 1)
            self._decode_tokens = max(0.0, self._decode_tokens - track.remaining)

    def _drop_prefill(self, track: Track) -> None:
        self._version += 1
        with contextlib.suppress(ValueError):
            self.prefill.remove(track)

    # -- decode
    def _integrate(self, now: float) -> None:
        if now > self._integral_at:
            if self.decode:
                self._integral += len(self.decode) * (now - self._integral_at)
            self._integral_at = now

    def decoding(self) -> int:
        return len(self.decode)

    def decode_load(self, now: float, expected: Callable[[Track], float]) -> float:
        """Expected output tokens still to come from the requests decoding here, each
        request's expectation corrected by the tokens it has generated so far."""
        if now - self._decode_at >= DECODE_CACHE_S:
            total = 0.0
            for track in self.decode:
                track.expected = expected(track)
                track.remaining = max(0.0, track.expected - track.tokens)
                total += track.remaining
            self._decode_tokens, self._decode_at = total, now
        return self._decode_tokens


def water_level(engines: Iterable[tuple[float, float]], count: float) -> float:
    """When queued work is done if spread over engines as they free up.

    ``engines``: (seconds until the engine's placed prefill work is done, requests per
    second it then serves). Returns the level L with sum(rate * max(0, L - wait)) = count:
    the time by which ``count`` queued requests have all gone through. 0 when none queue.
    """
    items = sorted((max(0.0, w), r) for w, r in engines if r > 0 and math.isfinite(w))
    if count <= 0 or not items:
        return 0.0
    level, rate, remaining = items[0][0], 0.0, float(count)
    for wait, mu in items:
        if rate > 0:
            fill = rate * (wait - level)
            if fill >= remaining:
                return level + remaining / rate
            remaining -= fill
        level = wait
        rate += mu
    return level + remaining / rate

