"""The domain gate's store on Redis (distributed mode): per domain a sorted set of slot
leases and a pace hash, per origin a robots.txt hash; every step one Lua script that
gets ``now`` from the caller (:mod:`crawlhub.core.clock`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawlhub.agents.politeness.base import DomainRules, Grant, Release, RobotsEntry
from crawlhub.backends.redis import redis_client
from crawlhub.core.keys import DEFAULT_PREFIX, agent_keys

# Grant slots (KEYS: slots, pace; ARGV: now, n, concurrency, delay, lease, token).
# Expired slots are freed first, in this same step. Returns {ids joined by ',', wait,
# reason}. Key TTLs only collect idle domains; every decision reads the scores.
_ACQUIRE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local pace = redis.call('HMGET', KEYS[2], 'next', 'backoff')
local ready = math.max(tonumber(pace[1] or 0), tonumber(pace[2] or 0))
if ready > now then return {'', tostring(ready - now), 'pace'} end
local held = redis.call('ZCARD', KEYS[1])
local conc = tonumber(ARGV[3])
if held >= conc then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'', tostring(tonumber(first[2]) - now), 'full'}
end
local delay = tonumber(ARGV[4])
local k = math.min(tonumber(ARGV[2]), conc - held)
if delay > 0 then
  k = 1
  redis.call('HSET', KEYS[2], 'next', tostring(now + delay))
  redis.call('EXPIRE', KEYS[2], math.ceil(delay) + 3600)
end
local lease = tonumber(ARGV[5])
local ids, z = {}, {}
for i = 0, k - 1 do
  local id = ARGV[6] .. ':' .. i
  ids[#ids + 1] = id
  z[#z + 1] = tostring(now + lease)
  z[#z + 1] = id
  if #z >= 1000 or i == k - 1 then  -- unpack() has a stack limit
    redis.call('ZADD', KEYS[1], unpack(z))
    z = {}
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(lease) + 60)
return {table.concat(ids, ','), '0', ''}
"""

# Free slots and set backoffs (KEYS: the per-domain key stem; ARGV: now, then domain /
# slot / backoff end ("" = none) triples). A later backoff already set is kept.
_RELEASE = """
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  local stem = KEYS[1] .. ARGV[i]
  redis.call('ZREM', stem .. ':slots', ARGV[i + 1])
  if ARGV[i + 2] ~= '' then
    local until_ = tonumber(ARGV[i + 2])
    local old = tonumber(redis.call('HGET', stem .. ':pace', 'backoff') or 0)
    if until_ > old then
      redis.call('HSET', stem .. ':pace', 'backoff', tostring(until_))
      redis.call('EXPIRE', stem .. ':pace', math.ceil(until_ - now) + 3600)
    end
  end
end
return 1
"""

# Extend held slots (KEYS: the per-domain key stem; ARGV: now, then domain / slot / new
# expiry triples); a slot expired at now is not brought back. Returns how many moved.
_EXTEND = """
local now, n = tonumber(ARGV[1]), 0
for i = 2, #ARGV, 3 do
  local key = KEYS[1] .. ARGV[i] .. ':slots'
  local score = redis.call('ZSCORE', key, ARGV[i + 1])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', ARGV[i + 2], ARGV[i + 1])
    redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[i + 2]) - now) + 60)
    n = n + 1
  end
end
return n
"""

# Claim the robots.txt fetch of one origin (KEYS: its hash; ARGV: now, claim end).
_CLAIM = """
local now = tonumber(ARGV[1])
local e = redis.call('HMGET', KEYS[1], 'status', 'expires', 'claim')
if e[1] and tonumber(e[2]) > now then return 0 end
if e[3] and tonumber(e[3]) > now then return 0 end
redis.call('HSET', KEYS[1], 'claim', ARGV[2])
if not e[1] then redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) - now) + 60) end
return 1
"""


class RedisGateStore:
    """:class:`~crawlhub.agents.politeness.base.GateStore` on a Redis/Valkey server."""

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.url = url
        self._redis = redis_client(url, name="domain gate")
        keys = agent_keys(prefix)
        self._domain = keys["domain"]
        self._robots = keys["robots"]
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)
        self._claim = self._redis.register_script(_CLAIM)
        self._extend = self._redis.register_script(_EXTEND)

    async def acquire(self, domain: str, n: int, now: float, rules: DomainRules,
                      token: str) -> Grant:
        stem = self._domain + domain
        ids, wait, reason = await self._acquire(
            keys=[f"{stem}:slots", f"{stem}:pace"],
            args=[repr(now), n, rules.concurrency, repr(rules.delay), repr(rules.lease),
                  token])
        text = ids.decode() if isinstance(ids, bytes) else str(ids)
        why = reason.decode() if isinstance(reason, bytes) else str(reason)
        return Grant(text.split(",") if text else [], float(wait), why)

    async def release(self, releases: Sequence[Release], now: float) -> None:
        if not releases:
            return
        args: list[str] = [repr(now)]
        for r in releases:
            args += [r.domain, r.slot, "" if r.backoff_until is None else repr(r.backoff_until)]
        await self._release(keys=[self._domain], args=args)

    async def extend(self, slots: Sequence[tuple[str, str, float]], now: float) -> int:
        if not slots:
            return 0
        args: list[str] = [repr(now)]
        for domain, slot, until in slots:
            args += [domain, slot, repr(until)]
        return int(await self._extend(keys=[self._domain], args=args))

    async def reset(self) -> None:
        # Only this prefix's domain keys; SCAN, not KEYS, so the server is not blocked.
        keys = [k async for k in self._redis.scan_iter(match=f"{self._domain}*", count=1000)]
        for start in range(0, len(keys), 500):
            await self._redis.delete(*keys[start:start + 500])
        # robots.txt claims go, the files stay (a hash holding only a claim goes with it)
        async for key in self._redis.scan_iter(match=f"{self._robots}*", count=1000):
            await self._redis.hdel(key, "claim")

    async def held(self, domain: str, now: float) -> int:
        return int(await self._redis.zcount(f"{self._domain}{domain}:slots",
                                            f"({now!r}", "+inf"))

    async def robots_get(self, origin: str) -> RobotsEntry | None:
        values: list[Any] = await self._redis.hmget(self._robots + origin,
                                                    ["status", "body", "expires"])
        status, body, expires = values
        if status is None:
            return None
        return RobotsEntry(status=int(status), body=bytes(body or b""), expires=float(expires))

    async def robots_claim(self, origin: str, now: float, until: float) -> bool:
        return bool(await self._claim(keys=[self._robots + origin],
                                      args=[repr(now), repr(until)]))

    async def robots_put(self, origin: str, entry: RobotsEntry, now: float) -> None:
        key = self._robots + origin
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"status": entry.status, "body": entry.body,
                                    "expires": repr(entry.expires), "claim": "0"})
            pipe.expire(key, max(1, int(entry.expires - now)) + 86400)
            await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()
