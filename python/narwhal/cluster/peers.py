"""The other routers' load, as they last published it: what placement and predictive
admission add to this router's own live load.

Every member (one worker process of one instance) publishes, per engine, the seconds of
prefill work it has placed there and not yet seen finish, and its requests waiting for
placement (count and prompt tokens, per model); an instance's syncing worker also publishes
the instance's requests in prefill and decoding per engine (its shared board's counts). A
read here is a list index and a subtraction: the sums are made once per sync.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from narwhal.cluster.quota import EngineLike


class Book(Protocol):
    count: int
    tokens: int


class LocalLoad(Protocol):
    """What this worker knows of its own load (``learning.Learning`` provides it): the
    prefill work placed per engine, and the requests waiting (``pending`` for the default
    model, ``pendings`` for the others, keyed by an object with a ``name``)."""

    @property
    def pending(self) -> Any: ...
    @property
    def pendings(self) -> Mapping[Any, Any]: ...

    def prefill_wait(self, engine: Any, now: float) -> float: ...


def local_load(engines: Sequence[EngineLike], local: LocalLoad, instance: str,
               inflight: Mapping[str, tuple[int, int]] | None) -> dict[str, Any]:
    """This member's load document (``inflight``: the instance's board counts, published by
    its syncing worker only)."""
    now = time.monotonic()
    pending = {"": (local.pending.count, local.pending.tokens)}
    for served, book in local.pendings.items():
        if book.count:
            pending[served.name] = (book.count, book.tokens)
    load: dict[str, Any] = {
        "instance": instance,
        "wait": {e.name: round(w, 4) for e in engines
                 if (w := local.prefill_wait(e, now)) > 0.0},
        "pending": {k: v for k, v in pending.items() if v[0]},
    }
    if inflight is not None:
        load["inflight"] = {k: v for k, v in inflight.items() if v[0] or v[1]}
    return load


class PeerLoad:
    """The sums of the other members' last published load, by engine index."""

    __slots__ = ("_pending", "decode", "members", "prefill", "wait_end")

    def __init__(self, capacity: int = 0) -> None:
        self.wait_end = [0.0] * capacity  # time.monotonic() when their prefill work is done
        self.prefill = [0] * capacity  # their requests in prefill (other instances only)
        self.decode = [0] * capacity  # their requests decoding (other instances only)
        self._pending: dict[str, tuple[int, int]] = {}
        self.members = 0

    # -- the per-request reads ---------------------------------------------------------------
    def prefill_wait(self, index: int, now: float) -> float:
        """Seconds until the prefill work the others placed on engine ``index`` is done."""
        wait_end = self.wait_end
        if index >= len(wait_end):
            return 0.0
        left = wait_end[index] - now
        return left if left > 0.0 else 0.0

    def inflight(self, index: int) -> tuple[int, int]:
        if index >= len(self.prefill):
            return 0, 0
        return self.prefill[index], self.decode[index]

    def pending(self, model: str) -> tuple[int, int]:
        """The others' requests waiting for placement for ``model`` ("" the default)."""
        return self._pending.get(model, (0, 0))

    # -- the sync task -----------------------------------------------------------------------
    def clear(self) -> None:
        """Forget the others (Redis unreachable: their load can no longer be known)."""
        self.wait_end = [0.0] * len(self.wait_end)
        self.prefill = [0] * len(self.prefill)
        self.decode = [0] * len(self.decode)
        self._pending = {}
        self.members = 0

    def update(self, engines: Sequence[EngineLike], loads: Mapping[str, tuple[int, Any]],
               now_ms: int, me: str, instance: str) -> None:
        """Sum the others' published ``loads`` (member -> (stamp ms, load)); ``now_ms``:
        Redis's time of this read, so each load ages by Redis's clock alone."""
        capacity = max((e.index for e in engines), default=-1) + 1
        backlog = [0.0] * capacity
        prefill, decode = [0] * capacity, [0] * capacity
        pending: dict[str, tuple[int, int]] = {}
        index = {e.name: e.index for e in engines}
        members = 0
        for member, (stamp, load) in loads.items():
            if member == me:
                continue
            members += 1
            age = max(0.0, (now_ms - stamp) / 1000.0)
            for name, wait in load.get("wait", {}).items():
                i = index.get(name)
                if i is not None:
                    backlog[i] += max(0.0, wait - age)
            if load.get("instance") != instance:  # siblings' counts are on the shared board
                for name, (in_prefill, decoding) in load.get("inflight", {}).items():
                    i = index.get(name)
                    if i is not None:
                        prefill[i] += in_prefill
                        decode[i] += decoding
            for model, (count, tokens) in load.get("pending", {}).items():
                have = pending.get(model, (0, 0))
                pending[model] = (have[0] + count, have[1] + tokens)
        at = time.monotonic()
        self.wait_end = [at + b if b > 0 else 0.0 for b in backlog]
        self.prefill, self.decode, self._pending = prefill, decode, pending
        self.members = members

    def describe(self, index: int) -> dict[str, Any]:
        prefill, decode = self.inflight(index)
        return {"prefill_wait_s": round(self.prefill_wait(index, time.monotonic()), 4),
                "prefill": prefill, "decode": decode}
