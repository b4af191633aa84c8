"""Hub state on Redis (distributed mode): every hub process shares the ledger, counters,
leases and token buckets; every multi-key step is one Lua script."""

from __future__ import annotations

from collections.abc import Sequence

from crawlhub.backends.redis import redis_client
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.keys import DEFAULT_PREFIX, hub_keys
from crawlhub.hub.state.base import (
    CLAIM_LEASE,
    DEFAULT_RETENTION,
    RATE_KEEP,
    LedgerEntry,
    Settle,
    _dumps,
    _loads,
)
from crawlhub.hub.state.intake import RedisIntake

# Lease entries whose lease ended unsettled, then those whose deadline passed; purge
# entries past their retention that nobody holds (KEYS: ledger, deadlines, retention,
# leases, pending; ARGV: now, limit, lease end). Returns what each lease is for and the
# raw entry, in pairs. A claimed entry stays in the ledger.
_CLAIM_LUA = """
local out = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(due) do
  local raw = redis.call('HGET', KEYS[1], id)
  if raw then
    redis.call('ZADD', KEYS[4], ARGV[3], id)
    local pending = redis.call('HGET', KEYS[5], id) or 'timeout'
    table.insert(out, pending)
    table.insert(out, raw)
  else
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  end
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  local raw = redis.call('HGET', KEYS[1], id)
  if raw then
    redis.call('ZADD', KEYS[4], ARGV[3], id)
    redis.call('HSET', KEYS[5], id, 'timeout')
    table.insert(out, 'timeout')
    table.insert(out, raw)
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(old) do
  if not redis.call('ZSCORE', KEYS[4], id) then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[3], id)
end
return out
"""

# Every lease ends now (KEYS: leases; ARGV: now): the next claim takes the entries over.
_END_LEASES_LUA = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], ARGV[1], id)
end
return #ids
"""

# Settle one entry if it is still exactly what the caller read (KEYS: ledger, deadlines,
# retention, leases, pending, counters, unpushed; ARGV: uuid, expected entry, next entry
# ("" = remove), its deadline ("" = none), what its lease is for ("" = no lease: it waits
# for its result), lease end, retention expiry, then counter field / increment pairs).
# Settled means pushed: the intake has no push of it left to redo.
_SETTLE_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local id = ARGV[1]
redis.call('ZREM', KEYS[7], id)
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
else
  redis.call('HSET', KEYS[1], id, ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[7], id)
  if ARGV[5] == '' then
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    if ARGV[4] == '' then
      redis.call('ZREM', KEYS[2], id)
    else
      redis.call('ZADD', KEYS[2], ARGV[4], id)
    end
  else
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[4], ARGV[6], id)
    redis.call('HSET', KEYS[5], id, ARGV[5])
  end
end
for i = 8, #ARGV, 2 do redis.call('HINCRBY', KEYS[6], ARGV[i], ARGV[i + 1]) end
return 1
"""

# Record entries (KEYS: ledger, deadlines, retention, counters; ARGV: uuids joined, their
# lengths, entries joined, their lengths, deadlines ("" = none), retention expiry, then
# counter field / increment pairs). Packed into a
# few arguments: encoding hundreds of small arguments is what costs the client most.
_RECORD_LUA = """
local function split(blob, lengths)
  local out, pos = {}, 1
  for len in string.gmatch(lengths, '[^,]+') do
    local n = tonumber(len)
    table.insert(out, string.sub(blob, pos, pos + n - 1))
    pos = pos + n
  end
  return out
end
local ids = split(ARGV[1], ARGV[2])
local entries = split(ARGV[3], ARGV[4])
local deadlines = {}
for d in string.gmatch(ARGV[5], '([^,]*),?') do table.insert(deadlines, d) end
-- Bulk commands, a few hundred fields at a time (unpack has a stack limit).
local h, z, r = {}, {}, {}
for i, id in ipairs(ids) do
  h[#h + 1] = id; h[#h + 1] = entries[i]
  if deadlines[i] ~= nil and deadlines[i] ~= '' then
    z[#z + 1] = deadlines[i]; z[#z + 1] = id
  end
  r[#r + 1] = ARGV[6]; r[#r + 1] = id
  if #h >= 512 or i == #ids then
    redis.call('HSET', KEYS[1], unpack(h))
    if #z > 0 then redis.call('ZADD', KEYS[2], unpack(z)) end
    redis.call('ZADD', KEYS[3], unpack(r))
    h, z, r = {}, {}, {}
  end
end
for i = 7, #ARGV, 2 do redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
return #ids
"""

# Remove one entry and return it (KEYS: ledger, deadlines, retention; ARGV: uuid).
_RESOLVE_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return raw
"""

# Token bucket shared by every hub process (KEYS: bucket hash; ARGV: rate, n, burst, the
# caller's now: crawlhub.core.clock, hosts keep their clocks in sync).
_TOKENS_LUA = """
local now = tonumber(ARGV[4])
local rate = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or burst)
local stamp = tonumber(redis.call('HGET', KEYS[1], 'stamp') or now)
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local wait = 0
if tokens >= n then tokens = tokens - n else wait = (n - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('EXPIRE', KEYS[1], 3600)
return tostring(wait)
"""


class RedisHubState(RedisIntake):
    """Hub state on Redis (distributed mode): every hub process shares it."""

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX,
                 retention: float = DEFAULT_RETENTION,
                 clock: Clock | None = None) -> None:
        self.url = url
        self.retention = retention
        #: Epoch seconds for retention and token buckets (crawlhub.core.clock: the caller's,
        #: never the server's); tests pass a fake one.
        self.clock: Clock = clock or system_clock
        self._redis = redis_client(url, name="hub state")
        self._keys = hub_keys(prefix)
        self._prefix = prefix
        self._record = self._redis.register_script(_RECORD_LUA)
        self._claim = self._redis.register_script(_CLAIM_LUA)
        self._end_leases = self._redis.register_script(_END_LEASES_LUA)
        self._settle = self._redis.register_script(_SETTLE_LUA)
        self._resolve = self._redis.register_script(_RESOLVE_LUA)
        self._tokens = self._redis.register_script(_TOKENS_LUA)

    @property
    def _ledger_keys(self) -> list[str]:
        k = self._keys
        return [k["ledger"], k["deadlines"], k["retention"]]

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        if not entries:
            await self.incr_many(counters)
            return
        ids = [str(e.task["task_uuid"]).encode() for e in entries]
        blobs = [_dumps(e).encode() for e in entries]
        args: list[bytes | str | int] = [
            b"".join(ids), ",".join(str(len(i)) for i in ids),
            b"".join(blobs), ",".join(str(len(b)) for b in blobs),
            ",".join("" if e.deadline is None else repr(e.deadline) for e in entries),
            repr(self.clock() + self.retention),
        ]
        for outbound, field, n in counters:
            args += [f"{outbound}\x1f{field}", n]
        await self._record(keys=[*self._ledger_keys, self._keys["counters"]], args=args)

    async def get(self, task_uuid: str) -> LedgerEntry | None:
        raw = await self._redis.hget(self._keys["ledger"], task_uuid)
        return _loads(raw) if raw else None

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        raw = await self._resolve(keys=self._ledger_keys, args=[task_uuid])
        return _loads(raw) if raw else None

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        k = self._keys
        out = await self._claim(keys=[*self._ledger_keys, k["leases"], k["pending"]],
                                args=[repr(now), limit, repr(now + lease)])
        return [_loads(out[i + 1], out[i]) for i in range(0, len(out), 2)]

    async def end_leases(self, now: float) -> int:
        return int(await self._end_leases(keys=[self._keys["leases"]], args=[repr(now)]))

    async def get_many(self, task_uuids: Sequence[str]) -> dict[str, LedgerEntry]:
        uuids = list(dict.fromkeys(task_uuids))
        if not uuids:
            return {}
        raws = await self._redis.hmget(self._keys["ledger"], uuids)
        return {u: _loads(raw) for u, raw in zip(uuids, raws, strict=True) if raw}

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        [done] = await self.settle_many([Settle(current, after, counters, lease_until)])
        return done

    async def settle_many(self, items: Sequence[Settle]) -> list[bool]:
        """One pipeline (one round trip) of one settle script per item: each script is
        atomic on its own, so each item is applied or skipped alone."""
        if not items:
            return []
        expires = repr(self.clock() + self.retention)
        k = self._keys
        keys = [*self._ledger_keys, k["leases"], k["pending"], k["counters"], k["unpushed"]]
        raws: list[str | bytes] = []
        async with self._redis.pipeline(transaction=False) as pipe:
            for item in items:
                current, after = item.current, item.after
                if current.raw is None:
                    raise ValueError("settle needs an entry read from the ledger"
                                     " (get/claim_expired)")
                raw: str | bytes = "" if after is None else after.raw or _dumps(after)
                raws.append(raw)
                args: list[str | bytes | int] = [
                    str(current.task["task_uuid"]), current.raw, raw,
                    "" if after is None or after.deadline is None else repr(after.deadline),
                    "" if after is None else after.pending or "",
                    repr(item.lease_until), expires,
                ]
                for outbound, name, n in item.counters:
                    args += [f"{outbound}\x1f{name}", n]
                await self._settle(keys=keys, args=args, client=pipe)
            results = await pipe.execute()
        done = [bool(r) for r in results]
        for item, raw, ok in zip(items, raws, done, strict=True):
            if ok and item.after is not None:
                item.after.raw = raw
        return done

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        if not counts:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for outbound, second, n in counts:
                key = f"{self._keys['rate']}{second}"
                pipe.hincrby(key, outbound, n)
                pipe.expire(key, RATE_KEEP)
            await pipe.execute()

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in range(max(first, last - RATE_KEEP), last + 1):
                pipe.hgetall(f"{self._keys['rate']}{s}")
            buckets = await pipe.execute()
        total: dict[str, int] = {}
        for bucket in buckets:
            for key, value in bucket.items():
                name = key.decode() if isinstance(key, bytes) else str(key)
                total[name] = total.get(name, 0) + int(value)
        return total

    async def incr(self, outbound: str, field: str, n: int = 1) -> None:
        await self._redis.hincrby(self._keys["counters"], f"{outbound}\x1f{field}", n)

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None:
        if not items:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for outbound, field, n in items:
                pipe.hincrby(self._keys["counters"], f"{outbound}\x1f{field}", n)
            await pipe.execute()

    async def counters(self) -> dict[str, dict[str, int]]:
        raw = await self._redis.hgetall(self._keys["counters"])
        result: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            text = key.decode() if isinstance(key, bytes) else str(key)
            outbound, _, field = text.partition("\x1f")
            result.setdefault(outbound, {})[field] = int(value)
        return result

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        now = repr(self.clock())
        wait = await self._tokens(keys=[f"{self._keys['tokens']}:{scope}"],
                                  args=[rate, n, burst, now])
        return float(wait)

    async def pending(self) -> int:
        return int(await self._redis.hlen(self._keys["ledger"]))

    async def close(self) -> None:
        await self._redis.aclose()
