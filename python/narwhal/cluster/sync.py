"""The cluster's sync task: one Redis round trip or two per interval, none per request.

Every ``sync_interval_ms`` each member (each worker process of each instance) publishes its
load and reads the others' (``peers.py``) and the shared documents newer than it has seen;
one worker per instance (the holder of a lock on its shared board's file, or the only
worker) also claims the instance's quotas (``quota.py``) and writes them where every worker
of the instance reads them. Redis unreachable: the quotas fall back to limit ÷ the last
known instance count, the others' load is forgotten, and the task keeps trying; it rejoins
on the first good round (holding the fallback share for one TTL, until every instance has
claimed again).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from narwhal._narwhal_fast import Board
from narwhal.cluster.locks import ClusterLocks, Locks
from narwhal.cluster.peers import LocalLoad, PeerLoad, local_load
from narwhal.cluster.quota import (
    DECODE,
    KIND_SUFFIX,
    PREFILL,
    EngineLike,
    EngineLimits,
    configured,
    fair_target,
    fallback_share,
    in_use,
    kinds,
)
from narwhal.cluster.store import RedisStore
from narwhal.config import Cluster
from narwhal.fleet.ha import INSTANCE_ID
from narwhal.tasks import stop_task

log = logging.getLogger("narwhal.cluster")

LEADER_LOCK_OFFSET = 1 << 39
"""The byte of the shared board's file whose lock makes a worker its instance's syncer."""
TTL_INTERVALS = 10
MAX_ENGINES = 4096
"""Engine indices the quota table holds (the board's own maximum)."""
MIN_TTL_MS = 1000
STOP_WAIT_S = 1.0
"""How long stopping waits for the sync loop (a round is bounded by the store's timeouts)."""

Receiver = Callable[[str, Any], None]


class Profiles(Protocol):
    """The learning supervisor as the cluster uses it (``learning/supervisor.py``)."""

    locks: Any

    def share(self, locks: Locks, publish: Callable[[Any, dict[str, Any]], None]) -> None: ...
    def adopt_shared(self, index: int, entry: dict[str, Any]) -> bool: ...


class ClusterSync:
    """This worker's membership of the cluster: quotas, shared load, shared documents.

    ``publish(kind, doc)`` shares a JSON document with every other member (versioned by
    Redis; the newest of each kind wins); ``subscribe(prefix, receiver)`` calls
    ``receiver(kind, doc)`` on this worker's loop, within one sync interval, for each
    newer document whose kind starts with ``prefix`` that another member published
    (documents published before this member joined arrive at its first sync).
    """

    def __init__(self, config: Cluster, engines: Sequence[EngineLike], board: Board,
                 local: LocalLoad, *, on_grow: Callable[[], None]) -> None:
        self.config = config
        self.engines = engines
        self.board = board
        self.local = local
        self.on_grow = on_grow
        self.interval_s = config.sync_interval_ms / 1000.0
        self.ttl_ms = max(MIN_TTL_MS, TTL_INTERVALS * config.sync_interval_ms)
        self.instance = INSTANCE_ID
        self.member = f"{INSTANCE_ID}/{os.getpid()}"
        capacity = max(MAX_ENGINES, len(engines))  # engines may join at run time
        self.limits = EngineLimits(capacity, None if board.path is None
                                   else f"{board.path}.cluster")
        self.peers = PeerLoad(capacity)
        self.store: RedisStore | None = None
        # -- state of the sync
        self.degraded = True  # until the first good round
        self.ever_synced = False
        self.last_error: str | None = "not yet synced"
        self.instances = 1  # live instances at the last good round
        self.leader = board.path is None
        self.syncs = [0, 0]  # [ok, failed]
        self._lock_fd: int | None = None
        self._claims: dict[str, Any] | None = None
        self._hold_until = 0.0  # after a rejoin: hold the fallback share until then
        self._seen = 0
        self._receivers: list[tuple[str, Receiver]] = []
        self._outbox: dict[str, Any] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- shared documents --------------------------------------------------------------------
    def publish(self, kind: str, doc: Any) -> None:
        """Share ``doc`` (JSON-serialisable) as the newest ``kind``; sent at once, or at the
        first good round when Redis is unreachable."""
        self._outbox[kind] = doc
        if self._wake is not None:
            self._wake.set()

    def subscribe(self, prefix: str, receiver: Receiver) -> None:
        self._receivers.append((prefix, receiver))

    def share_profiles(self, profiles: Profiles) -> None:
        """One instance profiles an engine at a time; the others adopt its profile."""
        profiles.share(ClusterLocks(profiles.locks, lambda: self.store, self._name_of),
                       lambda engine, entry: self.publish(f"profile:{engine.name}", entry))

        def adopt(kind: str, doc: Any) -> None:
            index = self.engine_index(kind.partition(":")[2])
            if index is not None and isinstance(doc, dict):
                profiles.adopt_shared(index, doc)
        self.subscribe("profile:", adopt)

    def engine_index(self, name: str) -> int | None:
        for engine in self.engines:
            if engine.name == name:
                return engine.index
        return None

    def _name_of(self, index: int) -> str:
        for engine in self.engines:
            if engine.index == index:
                return engine.name
        return str(index)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, store: RedisStore | None = None) -> None:
        """Connect (to ``store``, by default the configured Redis), run one round (bounded by
        the store's timeouts) and sync in the background. A failed first round leaves the
        instance serving alone's fallback."""
        self.store = store if store is not None else RedisStore(
            self.config.url or "", self.config.key_prefix, max(0.05, self.ttl_ms / 4000))
        self._wake = asyncio.Event()
        await self._round()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster")

    async def stop(self) -> None:
        """End the sync loop (bounded: see ``narwhal.tasks``), then leave the cluster."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None and not await stop_task(task, STOP_WAIT_S):
            log.warning("cluster sync did not stop within %.1f s of its cancellation; left "
                        "behind", STOP_WAIT_S)
        store, self.store = self.store, None
        if store is not None:
            with contextlib.suppress(Exception):
                await store.leave(self.instance if self.leader else None, self.member)
            with contextlib.suppress(Exception):
                await store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while not self._stopping:  # also ends a loop whose cancellation a round swallowed
            timer = asyncio.get_running_loop().call_later(self.interval_s, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()
            wake.clear()
            await self._round()

    # -- one round ---------------------------------------------------------------------------
    async def _round(self) -> None:
        store = self.store
        if store is None:
            return
        try:
            self._take_lead()
            inflight = None
            if self.leader:
                inflight = await self._claim(store)
            load = local_load(self.engines, self.local, self.instance, inflight)
            now_ms, loads, docs = await store.sync(self.member, self.ttl_ms, load, self._seen)
            for kind, doc in list(self._outbox.items()):
                await store.publish(kind, self.member, doc)
                if self._outbox.get(kind) is doc:
                    del self._outbox[kind]
        except Exception as exc:  # any store failure degrades, never stops serving
            self._failed(exc)
            return
        self.peers.update(self.engines, loads, now_ms, self.member, self.instance)
        self.instances = max(1, len({load.get("instance") for _, load in loads.values()}))
        self.syncs[0] += 1
        if self.degraded:
            if self.syncs[1]:
                log.warning("cluster sharing restored (%d instances)", self.instances)
            else:
                log.info("joined the cluster (%d instances)", self.instances)
            self.degraded, self.last_error, self.ever_synced = False, None, True
        self._receive(docs)

    async def _claim(self, store: RedisStore) -> dict[str, tuple[int, int]]:
        """Claim this instance's quotas; apply the grants. Returns the board's counts."""
        if self._claims is None:  # first claim: learn the others' wants first
            _, self._claims = await store.claim(self.instance, self.ttl_ms, {})
        if self.degraded:  # (re)joining: the others may not have claimed again yet
            self._hold_until = time.monotonic() + self.ttl_ms / 1000.0
        asks: dict[str, list[int]] = {}
        counts: dict[str, tuple[int, int]] = {}
        queued = self.board.queued()
        holding = time.monotonic() < self._hold_until
        limits = self.limits
        for engine in self.engines:
            inflight = self.board.inflight(engine.index)
            counts[engine.name] = inflight
            for kind in kinds(engine):
                key = f"{engine.name}/{KIND_SUFFIX[kind]}"
                limit = configured(engine, kind)
                used = in_use(inflight, engine.config.role, kind)
                want = min(limit, used + queued)
                wants = {name: int(claim[key][1]) for name, claim in self._claims.items()
                         if key in claim}
                wants[self.instance] = want
                target = fair_target(limit, wants, self.instance)
                if holding:
                    target = min(target, fallback_share(limit, self.instances))
                asks[key] = [limit, limits.get(engine.index, kind), used, want, target]
        grants, self._claims = await store.claim(self.instance, self.ttl_ms, asks)
        live = len(self._claims) + (self.instance not in self._claims)
        self.instances = max(1, live)

        def granted(engine: EngineLike, kind: int) -> int:
            return grants.get(f"{engine.name}/{KIND_SUFFIX[kind]}", 0)
        if limits.fill(self.engines, granted):
            self.on_grow()
        return counts

    def _failed(self, exc: Exception) -> None:
        self.syncs[1] += 1
        self.peers.clear()
        self._claims = None
        if self.leader:
            instances = self.instances
            grew = self.limits.fill(
                self.engines, lambda e, k: fallback_share(configured(e, k), instances))
            if grew:
                self.on_grow()
        error = f"{type(exc).__name__}: {exc}"
        if not self.degraded or self.last_error == "not yet synced":
            log.warning("cluster sharing degraded, Redis unreachable (%s): each engine limit "
                        "falls back to 1/%d of it here until Redis answers again",
                        error, self.instances)
        self.degraded, self.last_error = True, error

    def _take_lead(self) -> None:
        """One worker per instance claims quotas: the holder of a lock on the board file."""
        path = self.board.path
        if path is None or self.leader:
            return
        if self._lock_fd is None:
            self._lock_fd = os.open(path, os.O_RDWR)
        try:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, LEADER_LOCK_OFFSET)
        except OSError:
            return
        self.leader = True

    def _receive(self, docs: list[tuple[str, Any]]) -> None:
        for kind, entry in sorted(docs, key=lambda d: int(d[1].get("v", 0))):
            version = int(entry.get("v", 0))
            self._seen = max(self._seen, version)
            if entry.get("origin") == self.member:
                continue
            for prefix, receiver in self._receivers:
                if kind.startswith(prefix):
                    try:
                        receiver(kind, entry.get("doc"))
                    except Exception:
                        log.exception("applying the cluster document %s failed", kind)

    # -- reporting ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"backend": "redis", "instance": self.instance, "degraded": self.degraded,
                "sharing": "fallback" if self.degraded else "quota",
                "instances": self.instances, "members": self.peers.members + 1,
                "syncs_quotas": self.leader, "last_error": self.last_error}

    def describe_engine(self, engine: EngineLike) -> dict[str, Any]:
        limits = self.limits
        return {"limits": {"prefill": limits.prefill(engine.index),
                           "decode": limits.decode(engine.index)},
                "sharing": "fallback" if self.degraded else "quota",
                "peers": self.peers.describe(engine.index)}

    def metric_families(self) -> Iterator[Metric]:
        degraded = GaugeMetricFamily(
            "narwhal_cluster_degraded",
            "1 while this instance cannot reach the cluster's Redis and serves on the "
            "fallback share of each engine limit.")
        degraded.add_metric([], 1.0 if self.degraded else 0.0)
        instances = GaugeMetricFamily("narwhal_cluster_instances",
                                      "Router instances in the cluster at the last sync.")
        instances.add_metric([], self.instances)
        syncs = CounterMetricFamily("narwhal_cluster_syncs",
                                    "Cluster sync rounds with Redis, by outcome.",
                                    labels=["outcome"])
        syncs.add_metric(["ok"], self.syncs[0])
        syncs.add_metric(["failed"], self.syncs[1])
        quota = GaugeMetricFamily(
            "narwhal_engine_quota",
            "This instance's share of the engine's limit (prefill: max_prefill; decode: "
            "max_decode, both phases on a mixed engine).", labels=["engine", "phase"])
        for engine in self.engines:
            for kind in kinds(engine):
                quota.add_metric([engine.name, "prefill" if kind == PREFILL else "decode"],
                                 self.limits.get(engine.index, kind))
        yield from (degraded, instances, syncs, quota)


__all__ = ["DECODE", "PREFILL", "ClusterSync"]
