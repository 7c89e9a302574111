"""The cluster's Redis keys and the scripts that read and write them (one round trip each).

Keys under ``<prefix>:cluster:``: ``members`` (zset: worker member -> expiry, Redis time in
ms), ``load`` (hash: member -> "<stamp ms> <load json>"), ``instances`` (zset: instance ->
expiry), ``claims`` (hash: instance -> {limit key: [claim, want]}), ``docs`` / ``docvers``
(hash: kind -> {"v", "origin", "doc"} / version), ``docver`` (the version counter) and
``lock:<name>`` (profiling locks). Expired members and instances are dropped by whichever
script runs next, so a dead instance's claims come back to the others after the TTL.
"""

from __future__ import annotations

from typing import Any

import orjson

# KEYS: members, load, docvers, docs. ARGV: member, ttl ms, load json, doc version seen.
# Returns {now ms, {member, "<stamp> <json>", ...}, {kind, doc json, ...}}.
_SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], dead)
  redis.call('HDEL', KEYS[2], dead)
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], now .. ' ' .. ARGV[3])
local seen = tonumber(ARGV[4])
local docs = {}
local vers = redis.call('HGETALL', KEYS[3])
for i = 1, #vers, 2 do
  if tonumber(vers[i + 1]) > seen then
    docs[#docs + 1] = vers[i]
    docs[#docs + 1] = redis.call('HGET', KEYS[4], vers[i]) or ''
  end
end
return {now, redis.call('HGETALL', KEYS[2]), docs}
"""

# KEYS: instances, claims. ARGV: instance, ttl ms, {key: [limit, in force, in use, want,
# target]} json. Each limit key grows only into room the other instances do not claim; the
# claim recorded is at least every limit this instance may still be using.
# Returns {grants json, {instance, claims json, ...} as they were before this call}.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], dead)
  redis.call('HDEL', KEYS[2], dead)
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local all = redis.call('HGETALL', KEYS[2])
local others = {}
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] then
    for k, v in pairs(cjson.decode(all[i + 1])) do others[k] = (others[k] or 0) + v[1] end
  end
end
local grants, record = {}, {}
for k, v in pairs(cjson.decode(ARGV[3])) do
  local new = math.max(0, math.min(v[5], v[1] - (others[k] or 0)))
  grants[k] = new
  record[k] = {math.max(new, v[2], v[3]), v[4]}
end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(record))
return {cjson.encode(grants), all}
"""

# KEYS: instances, claims, members, load. ARGV: instance, member. Leaving cleanly.
_LEAVE = """
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
"""

# KEYS: docver, docvers, docs. ARGV: kind, origin, doc json. Returns the new version.
_PUBLISH = """
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], v)
redis.call('HSET', KEYS[3], ARGV[1], '{"v":' .. v .. ',"origin":' .. cjson.encode(ARGV[2])
  .. ',"doc":' .. ARGV[3] .. '}')
return v
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore:
    """One Redis client and the cluster's scripts (``redis.asyncio``, the ``narwhal[redis]``
    extra, imported only here and only when a cluster is configured)."""

    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        base = f"{prefix}:cluster:"
        self.keys = {name: base + name for name in (
            "members", "load", "docvers", "docs", "docver", "instances", "claims")}
        self.lock_prefix = base + "lock:"
        self._sync = self.client.register_script(_SYNC)
        self._claim = self.client.register_script(_CLAIM)
        self._leave = self.client.register_script(_LEAVE)
        self._publish = self.client.register_script(_PUBLISH)
        self._unlock = self.client.register_script(_UNLOCK)

    async def sync(self, member: str, ttl_ms: int, load: dict[str, Any],
                   seen: int) -> tuple[int, dict[str, tuple[int, Any]], list[tuple[str, Any]]]:
        """Publish this member's load; the Redis time, every member's load (stamp, data) and
        the documents newer than ``seen``."""
        k = self.keys
        now, loads, docs = await self._sync(
            keys=[k["members"], k["load"], k["docvers"], k["docs"]],
            args=[member, ttl_ms, orjson.dumps(load), seen])
        members: dict[str, tuple[int, Any]] = {}
        for name, raw in zip(loads[::2], loads[1::2], strict=True):
            stamp, _, body = raw.partition(b" ")
            members[name.decode()] = (int(stamp), orjson.loads(body))
        found = [(kind.decode(), orjson.loads(raw))
                 for kind, raw in zip(docs[::2], docs[1::2], strict=True) if raw]
        return int(now), members, found

    async def claim(self, instance: str, ttl_ms: int,
                    asks: dict[str, list[int]]) -> tuple[dict[str, int], dict[str, Any]]:
        """Claim quotas (``asks``: key -> [limit, in force, in use, want, target]); the
        grants and every instance's claims as they stood (key -> [claim, want])."""
        k = self.keys
        grants, claims = await self._claim(keys=[k["instances"], k["claims"]],
                                           args=[instance, ttl_ms, orjson.dumps(asks)])
        granted = orjson.loads(grants) if grants not in (b"{}", b"[]") else {}
        return ({key: int(v) for key, v in granted.items()},
                {name.decode(): orjson.loads(raw)
                 for name, raw in zip(claims[::2], claims[1::2], strict=True)})

    async def publish(self, kind: str, origin: str, doc: Any) -> int:
        k = self.keys
        return int(await self._publish(keys=[k["docver"], k["docvers"], k["docs"]],
                                       args=[kind, origin, orjson.dumps(doc)]))

    async def leave(self, instance: str | None, member: str) -> None:
        k = self.keys
        await self._leave(keys=[k["instances"], k["claims"], k["members"], k["load"]],
                          args=[instance or "", member])

    async def try_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        return bool(await self.client.set(self.lock_prefix + name, token, nx=True, px=ttl_ms))

    async def unlock(self, name: str, token: str) -> None:
        await self._unlock(keys=[self.lock_prefix + name], args=[token])

    async def close(self) -> None:
        await self.client.aclose()
