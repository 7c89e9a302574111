"""High availability: this instance's role, fixed (no lease backend) or held as a Redis lease."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Protocol

from narwhal.tasks import stop_task

if TYPE_CHECKING:
    from narwhal.config import Lease

log = logging.getLogger("narwhal.ha")

# One identity per router instance. Computed at import, i.e. in the parent before worker
# processes fork, so the workers of one instance hold the lease together.
INSTANCE_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

# Fraction of the TTL an instance serves after the send time of its last successful renewal.
# Redis counts the TTL from when it *received* the renewal, so this is strictly earlier; the
# 10 % margin covers clock-rate differences between this host and the Redis host.
SERVE_FRACTION = 0.9

# KEYS[1] lease, KEYS[2] epoch counter; ARGV[1] our token, ARGV[2] TTL ms, ARGV[3] the highest
# epoch we have seen (so an epoch never goes backwards if Redis lost its data).
# Free lease: SET NX PX and a new epoch from INCR. Ours: compare-and-extend. Another holder's:
# {0, epoch, PTTL} so the caller can try again the moment it expires.
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local epoch = redis.call('INCR', KEYS[2])
  local floor = tonumber(ARGV[3])
  if epoch <= floor then
    epoch = floor + 1
    redis.call('SET', KEYS[2], epoch)
  end
  return {1, epoch}
end
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, epoch}
end
return {0, epoch, redis.call('PTTL', KEYS[1])}
"""
# Compare-and-delete: give the lease back on shutdown, only if it is still ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class MissingExtra(RuntimeError):
    """A configured backend whose client library, an optional extra, is not installed."""


def check_backend(lease: Lease) -> None:
    """Raise MissingExtra, naming the extra to install, when the lease backend's client is
    missing: at start-up, before any worker, rather than when the lease loop first runs."""
    if lease.backend != "redis":
        return
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(
            "ha.lease.backend is 'redis' but the Redis client is not installed; "
            "install the extra: pip install 'narwhal[redis]'"
        ) from exc


class Role(Protocol):
    """What the router state needs from HA, with or without a lease backend."""

    lease_managed: bool

    def refusal(self) -> str | None: ...
    def describe(self) -> dict[str, Any]: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class StaticRole:
    """No lease backend: the role is ``ha.role`` until ``POST /admin/role`` changes it."""

    lease_managed = False

    def __init__(self, role: str):
        self.role = role

    def set_role(self, role: str) -> None:
        if role != self.role:
            log.warning("role: %s -> %s", self.role, role)
            self.role = role

    def refusal(self) -> str | None:
        return "router_standby" if self.role == "standby" else None

    def describe(self) -> dict[str, Any]:
        return {"role": self.role, "lease": None}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class RedisLease:
    """The active instance holds ``lease.key`` in Redis with a fencing epoch.

    Acquire with SET NX PX and a new epoch (INCR ``<key>:epoch``); renew every ``ttl/3`` with
    a compare-and-extend script so only the holder extends. The instance serves until
    ``SERVE_FRACTION * ttl`` after sending its last successful renewal, so it stops before
    the lease can expire in Redis, whatever Redis or the network do. Not holding: ``standby``
    if it never held the lease since start, ``fenced`` if it lost it; either way it keeps
    trying (every ``ttl/10``, and exactly when the holder's lease expires) and takes over
    as soon as the lease is free.
    """

    lease_managed = True

    def __init__(self, lease: Lease, *, token: str = INSTANCE_ID):
        assert lease.url is not None
        self.url = lease.url
        self.key = lease.key
        self.epoch_key = f"{lease.key}:epoch"
        self.ttl_s = lease.ttl_s
        self.token = token
        self.epoch: int | None = None  # of the lease held (or last held)
        self.seen_epoch = 0  # highest epoch observed in Redis
        self.held_ever = False
        self.valid_until = 0.0  # loop time this instance may serve until
        self.last_error: str | None = None
        self._serving = False  # for transition logs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._claim: Any = None
        self._release: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- the router's view --------------------------------------------------------------
    def holds(self) -> bool:
        loop = self._loop
        return loop is not None and loop.time() < self.valid_until

    def refusal(self) -> str | None:
        if self.holds():
            return None
        return "router_fenced" if self.held_ever else "router_standby"

    def describe(self) -> dict[str, Any]:
        role = "active" if self.holds() else ("fenced" if self.held_ever else "standby")
        return {
            "role": role,
            "lease": {
                "backend": "redis",
                "key": self.key,
                "holder": self.token,
                "held": self.holds(),
                "epoch": self.epoch,
                "ttl_s": self.ttl_s,
                "last_error": self.last_error,
            },
        }

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and make one claim (so an uncontested instance serves from its first
        request), then keep the lease in the background."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._loop = asyncio.get_running_loop()
        timeout = self.ttl_s / 3
        self._client = aioredis.Redis.from_url(
            self.url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._claim = self._client.register_script(_CLAIM)
        self._release = self._client.register_script(_RELEASE)
        delay = await self._tick()
        self._task = self._loop.create_task(self._run(delay))

    async def stop(self) -> None:
        """Stop renewing and hand the lease back, so a standby need not wait for the TTL."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None and not await stop_task(task, self.ttl_s):
            log.warning("lease loop did not stop within %.1f s of its cancellation; left "
                        "behind", self.ttl_s)
        client, self._client = self._client, None
        if client is None:
            return
        if self.holds():
            self.valid_until = 0.0
            try:
                await asyncio.wait_for(
                    self._release(keys=[self.key], args=[self.token]), self.ttl_s / 3
                )
                log.warning("lease %s released (epoch %s)", self.key, self.epoch)
            except Exception as exc:  # the lease then expires by itself
                log.warning("could not release lease %s: %s", self.key, exc)
        with contextlib.suppress(Exception):
            await client.aclose()

    # -- the lease loop -------------------------------------------------------------------
    async def _run(self, delay: float) -> None:
        while not self._stopping:  # also ends a loop whose cancellation a claim swallowed
            await asyncio.sleep(delay)
            delay = await self._tick()

    async def _tick(self) -> float:
        """One claim; returns the delay until the next."""
        loop = self._loop
        assert loop is not None
        ttl = self.ttl_s
        sent = loop.time()
        try:
            reply = await asyncio.wait_for(
                self._claim(
                    keys=[self.key, self.epoch_key],
                    args=[self.token, max(1, int(ttl * 1000)), self.seen_epoch],
                ),
                ttl / 3,
            )
            held, epoch = int(reply[0]), int(reply[1])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis down, slow or unreachable: serve out the lease
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._transition(loop)
            return max(0.05, ttl / 10)
        self.last_error = None
        self.seen_epoch = max(self.seen_epoch, epoch)
        if held:
            self.valid_until = sent + SERVE_FRACTION * ttl
            if self.epoch != epoch or not self._serving:
                log.warning("lease %s held with epoch %d", self.key, epoch)
            self.epoch = epoch
            self.held_ever = True
            self._transition(loop)
            return ttl / 3
        self.valid_until = 0.0
        self._transition(loop)
        pttl_ms = int(reply[2]) if len(reply) > 2 else -2
        if pttl_ms == -1:  # a key without expiry: not a lease we can ever take over
            return ttl / 3
        # Try again the moment the holder's lease expires, and every ttl/10 meanwhile, so a
        # lease handed back (shutdown) is picked up within a tenth of the TTL.
        return max(0.005, min(ttl / 10, pttl_ms / 1000 + 0.005))

    def _transition(self, loop: asyncio.AbstractEventLoop) -> None:
        serving = loop.time() < self.valid_until
        if serving is self._serving:
            return
        self._serving = serving
        if not serving and self.held_ever:
            log.error("lease %s lost (epoch %s): fenced%s", self.key, self.epoch,
                      f" ({self.last_error})" if self.last_error else "")


def make_role(role: str, lease: Lease) -> Role:
    """The HA role keeper the configuration asks for."""
    if lease.backend == "redis":
        check_backend(lease)
        return RedisLease(lease)
    return StaticRole(role)
