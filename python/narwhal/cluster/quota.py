"""Per-engine limits across router instances: each instance's quota and how it is shared.

An engine's ``max_prefill`` and ``max_decode`` hold for the sum of every instance of a
cluster. Each instance holds a *quota* of each limit, leased from Redis (``store.py``) and
rebalanced by demand every sync interval; placement passes the quota to
``Board.acquire_slot`` as the limit (:class:`EngineLimits`), so the per-request path reads a
number from memory and never waits on Redis.

Safety rests on one rule, kept by the claim script: an instance's recorded *claim* is at
least every limit it may still be using (``max(new quota, quota in force, in use)``), and a
quota only grows into room no other instance claims. Shrinking therefore takes two syncs
(apply the lower quota, then report it), growing one.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

PREFILL, DECODE = 0, 1
"""The two kinds of limit: prefill (``max_prefill``), and decode — for a mixed engine the
total of both phases (its ``max_decode``: a prefill is placed only with a decode slot to
come), for a decode engine its decoding requests."""
KIND_SUFFIX = ("p", "d")


class EngineLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def config(self) -> Any: ...


def kinds(engine: EngineLike) -> tuple[int, ...]:
    """Which limits of ``engine`` the cluster shares (a decode engine takes no prefill)."""
    role = engine.config.role
    if role == "prefill":
        return (PREFILL,)
    if role == "decode":
        return (DECODE,)
    return (PREFILL, DECODE)


def configured(engine: EngineLike, kind: int) -> int:
    return int(engine.config.max_prefill if kind == PREFILL else engine.config.max_decode)


def in_use(inflight: tuple[int, int], role: str, kind: int) -> int:
    """The instance's requests counting against one limit, from ``Board.inflight``."""
    prefill, decode = inflight
    if kind == PREFILL:
        return prefill
    return prefill + decode if role == "mixed" else decode


def fallback_share(limit: int, instances: int) -> int:
    """Without Redis: limit ÷ the last known instance count, at least one request (so an
    instance keeps serving even when the instances outnumber the limit)."""
    return max(1, limit // max(1, instances))


def fair_target(limit: int, wants: Mapping[str, int], me: str) -> int:
    """This instance's share of ``limit`` given every live instance's demand.

    Max-min fair on demand (in use plus waiting), each instance wanting at least one (so an
    idle instance keeps a slot to start on); whatever nobody wants is split evenly, the
    remainder going to the instances first in id order. Every instance computes the same
    split from the same wants.
    """
    wants = {k: max(1, v) for k, v in wants.items()}
    wants.setdefault(me, 1)
    order = sorted(wants, key=lambda k: (wants[k], k))
    alloc: dict[str, int] = {}
    left, count = limit, len(order)
    for i, name in enumerate(order):  # water-fill, smallest demand first
        share = left // (count - i)
        give = min(wants[name], share)
        alloc[name] = give
        left -= give
    # What nobody wants: split evenly (ids in order take the remainder).
    ids = sorted(alloc)
    base, extra = divmod(left, count)
    return alloc[me] + base + (1 if ids.index(me) < extra else 0)


class EngineLimits:
    """The limits placement passes to the board, by engine index: the cluster's quota,
    written by the instance's syncing worker and read by every worker.

    With several workers the numbers live in a small shared file mapped by each (``path``),
    so a quota change reaches every worker at once; one process keeps them in memory.
    """

    def __init__(self, capacity: int, path: str | None = None) -> None:
        self.capacity = capacity
        self.path = path
        size = max(1, 2 * capacity) * 4
        self._map: mmap.mmap | None = None
        if path is None:
            buffer: Any = bytearray(size)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                self._map = buffer = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self._cells = memoryview(buffer).cast("I")

    def prefill(self, index: int) -> int:
        return self._cells[2 * index] if index < self.capacity else 0

    def decode(self, index: int) -> int:
        return self._cells[2 * index + 1] if index < self.capacity else 0

    def get(self, index: int, kind: int) -> int:
        return self._cells[2 * index + kind] if index < self.capacity else 0

    def set(self, index: int, kind: int, value: int) -> None:
        if index < self.capacity:
            self._cells[2 * index + kind] = max(0, value)

    def fill(self, engines: Sequence[EngineLike], value_of: Any) -> bool:
        """Set each engine's limits to ``value_of(engine, kind)``; True when one grew."""
        grew = False
        for engine in engines:
            for kind in kinds(engine):
                value = int(value_of(engine, kind))
                grew = grew or value > self.get(engine.index, kind)
                self.set(engine.index, kind, value)
        return grew

    def close(self) -> None:
        self._cells.release()
        if self._map is not None:
            self._map.close()
            self._map = None
