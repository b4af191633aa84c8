"""The distributed seed store: seeds, leases and a shared bloom filter in Redis, moved by
Lua scripts so any number of processes see one frontier.

The bloom filter is plain Redis strings written with ``BITFIELD`` (no RedisBloom module,
whose licence is not open source). Clients hash each key once (xxh3-128) and send two
32-bit halves; the admit script derives the k bit positions of every layer by double
hashing, tests all layers (``GETBIT``, stopping at the first clear bit) and, for a new
key, sets its bits with one ``BITFIELD SET`` per key, stores the seed and bumps the
counters in the same atomic step: two processes never both admit one key.

Layout (names from :func:`crawlhub.keys.frontier_keys`, all in the frontier's slot):

- ``ready`` sorted set of pending seeds, score ``-priority``, member
  ``<seq:016d>|<priority>|<segment>|<key>`` so equal scores pop FIFO.
- ``due``: waiting seeds, score ``ready_at`` in ms; ``leased``: score ``lease_until`` ms.
- ``s:<segment>:seeds``: hash key -> ``<seq>|<priority>|<seed JSON>``, every seed the
  segment admitted (the exact check and the archive); ``s:<segment>:attempts``,
  ``s:<segment>:stats`` (counters), ``s:<segment>:bloom`` (layer sizes and counts) and
  ``s:<segment>:bloom:<i>`` (the bit arrays).
- ``segments``: sorted set of the segments held; ``seq``: the seed counter.

Times are the callers' clocks in integer milliseconds (exact in Lua's doubles).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from crawlhub.errors import FrontierError
from crawlhub.frontier.bloom import MAX_LAYER_BITS, layer_plan, split_hash
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.sqlite import check_frontier_name
from crawlhub.frontier.store import Entry, SegmentCounts, check_entries
from crawlhub.keys import frontier_keys, frontier_segment_key

T = TypeVar("T")

_BATCH = 1000
_COUNTERS = ("admitted", "duplicates", "pending", "leased", "done", "failed", "dispatched")

_PRELUDE = """
local function parse(member)
  local seq, prio, seg, key = string.match(member, '^(%d+)|(%-?%d+)|(%-?%d+)|(.*)$')
  return seq, tonumber(prio), seg, key
end

local function member_of(stem, seg, key)
  local v = redis.call('HGET', stem .. seg .. ':seeds', key)
  if not v then return nil end
  local seq, prio = string.match(v, '^(%d+)|(%-?%d+)|')
  return string.format('%016d|%s|%s|%s', tonumber(seq), prio, seg, key), tonumber(prio)
end

local function count(stem, seg, field, n)
  redis.call('HINCRBY', stem .. seg .. ':stats', field, n)
end

-- waiting seeds whose time came and expired leases go to ready (bounded per call)
local function sweep(stem, ready, due, leased, now)
  local moved = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 1000)) do
    local _, prio = parse(m)
    redis.call('ZREM', due, m)
    redis.call('ZADD', ready, -prio, m)
    moved = moved + 1
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', now, 'LIMIT', 0, 1000)) do
    local _, prio, seg = parse(m)
    redis.call('ZREM', leased, m)
    redis.call('ZADD', ready, -prio, m)
    count(stem, seg, 'leased', -1)
    count(stem, seg, 'pending', 1)
    moved = moved + 1
  end
  return moved
end
"""

# KEYS: seeds stats meta ready due seq segments
# ARGV: segment now_ms exact channel nplan (cap bits k)*nplan (key h1 h2 ready_ms prio disp payload)*
_ADMIT = """
local seeds, stats, meta, ready, due, seqkey, segments =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local seg, now, exact, channel = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
local nplan = tonumber(ARGV[5])
local p = 6
local plan = {}
for i = 1, nplan do
  plan[i] = {tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])}
  p = p + 3
end

local info = {}
local raw = redis.call('HGETALL', meta)
for i = 1, #raw, 2 do info[raw[i]] = raw[i + 1] end
local layers = {}
for i = 1, tonumber(info['layers'] or '0') do
  layers[i] = {cap = tonumber(info['cap' .. i]), bits = tonumber(info['bits' .. i]),
               k = tonumber(info['k' .. i]), count = tonumber(info['count' .. i] or '0'),
               key = meta .. ':' .. i}
end

local function add_layer()
  local i = #layers + 1
  local spec = plan[i]
  if not spec then
    error('frontier bloom filter of segment ' .. seg .. ' is full at ' .. #layers ..
          ' layers: raise frontier.expected_items')
  end
  -- allocate the whole bit array at once: exact size, no incremental regrowth
  redis.call('SETRANGE', meta .. ':' .. i, spec[2] / 8 - 1, '\0')
  layers[i] = {cap = spec[1], bits = spec[2], k = spec[3], count = 0, key = meta .. ':' .. i}
  redis.call('HSET', meta, 'layers', i, 'cap' .. i, spec[1], 'bits' .. i, spec[2],
             'k' .. i, spec[3], 'count' .. i, 0)
end
if #layers == 0 then add_layer() end

-- bit j of a key in a layer: (h1 + j * h2) mod bits (double hashing)
local function present(h1, h2)
  for i = 1, #layers do
    local layer = layers[i]
    local all = true
    for j = 0, layer.k - 1 do
      -- GETBIT stops at the first clear bit: a new key rarely needs more than two
      if redis.call('GETBIT', layer.key, (h1 + j * h2) % layer.bits) == 0 then
        all = false
        break
      end
    end
    if all then return true end
  end
  return false
end

local function set_bits(h1, h2, layer)
  local args = layer.args
  if not args then
    args = {}
    for j = 0, layer.k - 1 do
      args[4 * j + 1] = 'SET'; args[4 * j + 2] = 'u1'; args[4 * j + 4] = 1
    end
    layer.args = args
  end
  for j = 0, layer.k - 1 do args[4 * j + 3] = (h1 + j * h2) % layer.bits end
  redis.call('BITFIELD', layer.key, unpack(args))
end

local out = {}
local admitted, dups, pending, dispatched, signal = 0, 0, 0, 0, false
local seq = tonumber(redis.call('GET', seqkey) or '0')
local e = 0
while p <= #ARGV do
  e = e + 1
  local key, h1, h2 = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
  local ready_ms, prio, disp, payload = tonumber(ARGV[p + 3]), ARGV[p + 4], ARGV[p + 5], ARGV[p + 6]
  p = p + 7
  local new
  if present(h1, h2) then
    new = exact and redis.call('HEXISTS', seeds, key) == 0
  else
    local layer = layers[#layers]
    if layer.count >= layer.cap then
      add_layer()
      layer = layers[#layers]
    end
    set_bits(h1, h2, layer)
    layer.count = layer.count + 1
    new = true
  end
  if new then
    seq = seq + 1
    redis.call('HSET', seeds, key, seq .. '|' .. prio .. '|' .. payload)
    if disp == '1' then
      dispatched = dispatched + 1
    else
      local member = string.format('%016d|%s|%s|%s', seq, prio, seg, key)
      if ready_ms <= now then
        redis.call('ZADD', ready, -tonumber(prio), member)
        signal = true
      else
        redis.call('ZADD', due, ready_ms, member)
      end
      pending = pending + 1
    end
    admitted = admitted + 1
    out[e] = '1'
  else
    dups = dups + 1
    out[e] = '0'
  end
end
local counts = {}
for i = 1, #layers do
  counts[#counts + 1] = 'count' .. i
  counts[#counts + 1] = layers[i].count
end
redis.call('HSET', meta, unpack(counts))
if admitted > 0 then redis.call('SET', seqkey, string.format('%d', seq)) end
redis.call('HINCRBY', stats, 'admitted', admitted)
if dups > 0 then redis.call('HINCRBY', stats, 'duplicates', dups) end
if pending > 0 then redis.call('HINCRBY', stats, 'pending', pending) end
if dispatched > 0 then redis.call('HINCRBY', stats, 'dispatched', dispatched) end
redis.call('ZADD', segments, tonumber(seg), seg)
if signal then redis.call('PUBLISH', channel, '1') end
return table.concat(out)
"""

# KEYS: ready due leased   ARGV: stem now_ms lease_until_ms n
_CLAIM = """
local ready, due, leased = KEYS[1], KEYS[2], KEYS[3]
local stem, now, until_ms, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
sweep(stem, ready, due, leased, now)
local out = {}
if n <= 0 then return out end
local popped = redis.call('ZPOPMIN', ready, n)
for i = 1, #popped, 2 do
  local m = popped[i]
  local _, _, seg, key = parse(m)
  local v = redis.call('HGET', stem .. seg .. ':seeds', key)
  if v then  -- (a member without its seed record cannot be dispatched; it is dropped)
    redis.call('ZADD', leased, until_ms, m)
    local attempts = redis.call('HINCRBY', stem .. seg .. ':attempts', key, 1)
    count(stem, seg, 'pending', -1)
    count(stem, seg, 'leased', 1)
    out[#out + 1] = seg
    out[#out + 1] = key
    out[#out + 1] = attempts
    out[#out + 1] = string.match(v, '^%d+|%-?%d+|(.*)$')
  end
end
return out
"""

# KEYS: leased   ARGV: stem lease_until_ms (seg key)*
_EXTEND = """
local leased, stem, until_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local m = member_of(stem, ARGV[i], ARGV[i + 1])
  if m and redis.call('ZSCORE', leased, m) then
    redis.call('ZADD', leased, until_ms, m)
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
return table.concat(out)
"""

# KEYS: ready leased   ARGV: stem channel (seg key)*
_RELEASE = """
local ready, leased, stem, channel = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local released = 0
for i = 3, #ARGV, 2 do
  local seg, key = ARGV[i], ARGV[i + 1]
  local m, prio = member_of(stem, seg, key)
  if m and redis.call('ZREM', leased, m) == 1 then
    redis.call('ZADD', ready, -prio, m)
    if redis.call('HINCRBY', stem .. seg .. ':attempts', key, -1) < 0 then
      redis.call('HSET', stem .. seg .. ':attempts', key, 0)
    end
    count(stem, seg, 'leased', -1)
    count(stem, seg, 'pending', 1)
    released = released + 1
  end
end
if released > 0 then redis.call('PUBLISH', channel, '1') end
return released
"""

# KEYS: ready due leased   ARGV: stem channel seg key outcome now_ms ready_ms
_FINISH = """
local ready, due, leased = KEYS[1], KEYS[2], KEYS[3]
local stem, channel, seg, key, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, ready_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local m, prio = member_of(stem, seg, key)
if not m then return 0 end
local was
if redis.call('ZREM', leased, m) == 1 then
  was = 'leased'
elseif redis.call('ZREM', ready, m) == 1 or redis.call('ZREM', due, m) == 1 then
  was = 'pending'
else
  return 0
end
count(stem, seg, was, -1)
if outcome == 'ok' then
  count(stem, seg, 'done', 1)
elseif outcome == 'failed' then
  count(stem, seg, 'failed', 1)
else
  count(stem, seg, 'pending', 1)
  if ready_ms <= now then
    redis.call('ZADD', ready, -prio, m)
    redis.call('PUBLISH', channel, '1')
  else
    redis.call('ZADD', due, ready_ms, m)
  end
end
return 1
"""

# KEYS: ready due leased segments   ARGV: stem now_ms
_COUNTS = """
local ready, due, leased, segments, stem = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
sweep(stem, ready, due, leased, tonumber(ARGV[2]))
local out = {}
for _, seg in ipairs(redis.call('ZRANGE', segments, 0, -1)) do
  out[#out + 1] = seg
  out[#out + 1] = redis.call('HGETALL', stem .. seg .. ':stats')
end
return out
"""

# KEYS: segments   ARGV: stem before
_PRUNE = """
local segments, stem, before = KEYS[1], ARGV[1], tonumber(ARGV[2])
local gone = {}
for _, seg in ipairs(redis.call('ZRANGEBYSCORE', segments, '-inf', '(' .. before)) do
  local st = stem .. seg
  local owed = tonumber(redis.call('HGET', st .. ':stats', 'pending') or '0')
             + tonumber(redis.call('HGET', st .. ':stats', 'leased') or '0')
  if owed == 0 then
    local layers = tonumber(redis.call('HGET', st .. ':bloom', 'layers') or '0')
    for i = 1, layers do redis.call('DEL', st .. ':bloom:' .. i) end
    redis.call('DEL', st .. ':seeds', st .. ':attempts', st .. ':stats', st .. ':bloom')
    redis.call('ZREM', segments, seg)
    gone[#gone + 1] = seg
  end
end
return gone
"""

_SCRIPTS = {
    "admit": _ADMIT,
    "claim": _CLAIM,
    "extend": _EXTEND,
    "release": _RELEASE,
    "finish": _FINISH,
    "counts": _COUNTS,
    "prune": _PRUNE,
}


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


class RedisSeedStore:
    """Seeds of frontier ``name`` on the Redis (or Valkey) server at ``url``."""

    def __init__(
        self, url: str, name: str, *, prefix: str, expected_items: int, fp_rate: float
    ) -> None:
        self.name = check_frontier_name(name)
        self.url = url
        self.prefix = prefix
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self.keys = frontier_keys(prefix, name)
        self.stem = self.keys["segment"]
        plan = layer_plan(expected_items, fp_rate, 24)
        self._plan = [layer for layer in plan if layer.bits <= MAX_LAYER_BITS]
        if not self._plan:
            raise FrontierError(
                f"frontier {name!r}: expected_items {expected_items} at fp_rate {fp_rate} "
                "needs a bloom layer over 2^32 bits, the most a Redis string holds: lower "
                "expected_items or raise fp_rate"
            )
        self._plan_args: list[int] = [
            v for layer in self._plan for v in (layer.capacity, layer.bits, layer.hashes)
        ]
        redis_url = "redis://" + url[len("valkey://") :] if url.startswith("valkey://") else url
        try:
            self.redis = aioredis.Redis.from_url(redis_url)
        except ValueError as exc:
            raise FrontierError(
                f"frontier storage URL {redacted(url)!r} is malformed ({exc}): "
                "use redis://host:port/0"
            ) from None
        self.scripts = {n: self.redis.register_script(_PRELUDE + s) for n, s in _SCRIPTS.items()}
        self._pubsub: Any = None

    def __repr__(self) -> str:
        return f"<RedisSeedStore {self.name!r} at {redacted(self.url)} prefix={self.prefix!r}>"

    async def _call(self, op: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except RedisError as exc:
            raise FrontierError(
                f"frontier {self.name!r} on Redis {redacted(self.url)}: {op} failed: {exc} "
                "(check the server is running and the URL is right)"
            ) from exc

    def _seg(self, segment: int | str, part: str) -> str:
        return frontier_segment_key(self.prefix, self.name, int(segment), part)

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self._call("ping", self.redis.ping())

    async def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
        await self.redis.aclose()

    async def snapshot(self, current_segment: int) -> None:
        """Nothing to do: the filter lives in Redis (persisted by Redis itself)."""

    # ------------------------------------------------------------------ admission
    async def admit(self, entries: Sequence[Entry], now: float, *, exact: bool) -> list[bool]:
        check_entries(entries)
        results = [False] * len(entries)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(entries):
            groups[e.segment].append(i)
        k = self.keys
        head = [str(len(self._plan)), *map(str, self._plan_args)]
        for segment, indexes in groups.items():
            keys = [
                self._seg(segment, "seeds"),
                self._seg(segment, "stats"),
                self._seg(segment, "bloom"),
                k["ready"],
                k["due"],
                k["seq"],
                k["segments"],
            ]
            for start in range(0, len(indexes), _BATCH):
                chunk = indexes[start : start + _BATCH]
                args: list[Any] = [segment, _ms(now), "1" if exact else "0", k["signal"], *head]
                for i in chunk:
                    e = entries[i]
                    h1, h2 = split_hash(e.hash)
                    args += [
                        e.key,
                        h1,
                        h2,
                        _ms(e.ready_at),
                        e.seed.priority,
                        "1" if e.dispatched else "0",
                        e.seed.encode(),
                    ]
                flags = _text(await self._call("admit", self.scripts["admit"](keys, args)))
                for i, flag in zip(chunk, flags, strict=True):
                    results[i] = flag == "1"
        return results

    # ------------------------------------------------------------------ dispatch
    async def claim(self, n: int, now: float, lease_until: float) -> list[Seed]:
        k = self.keys
        raw = await self._call(
            "claim",
            self.scripts["claim"](
                [k["ready"], k["due"], k["leased"]],
                [self.stem, _ms(now), _ms(lease_until), n],
            ),
        )
        out = []
        for i in range(0, len(raw), 4):
            out.append(
                Seed.decode(
                    raw[i + 3],
                    segment=int(raw[i]),
                    key=_text(raw[i + 1]),
                    attempts=int(raw[i + 2]),
                    lease_until=lease_until,
                )
            )
        return out

    def _idents(self, seeds: Sequence[Seed]) -> list[Any]:
        args: list[Any] = []
        for s in seeds:
            if s.segment is None or s.key is None:
                raise FrontierError(f"seed {s.url!r} was not leased from frontier {self.name!r}")
            args += [s.segment, s.key]
        return args

    async def extend(self, seeds: Sequence[Seed], lease_until: float) -> list[bool]:
        if not seeds:
            return []
        flags = await self._call(
            "extend",
            self.scripts["extend"](
                [self.keys["leased"]], [self.stem, _ms(lease_until), *self._idents(seeds)]
            ),
        )
        return [f == "1" for f in _text(flags)]

    async def release(self, seeds: Sequence[Seed]) -> int:
        if not seeds:
            return 0
        k = self.keys
        return int(
            await self._call(
                "release",
                self.scripts["release"](
                    [k["ready"], k["leased"]], [self.stem, k["signal"], *self._idents(seeds)]
                ),
            )
        )

    async def finish(
        self, segment: int, key: str, outcome: Outcome, now: float, ready_at: float
    ) -> bool:
        k = self.keys
        done = await self._call(
            "finish",
            self.scripts["finish"](
                [k["ready"], k["due"], k["leased"]],
                [self.stem, k["signal"], segment, key, outcome, _ms(now), _ms(ready_at)],
            ),
        )
        return int(done) == 1

    async def next_due(self, now: float) -> float | None:
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(k["ready"])
            pipe.zrange(k["due"], 0, 0, withscores=True)
            pipe.zrange(k["leased"], 0, 0, withscores=True)
            ready, due, leased = await self._call("next_due", pipe.execute())
        if ready:
            return now
        times = [float(items[0][1]) / 1000 for items in (due, leased) if items]
        return min(times) if times else None

    async def counts(self, now: float) -> list[SegmentCounts]:
        k = self.keys
        raw = await self._call(
            "counts",
            self.scripts["counts"](
                [k["ready"], k["due"], k["leased"], k["segments"]], [self.stem, _ms(now)]
            ),
        )
        out = []
        for i in range(0, len(raw), 2):
            c = SegmentCounts(int(raw[i]))
            fields = raw[i + 1]
            for j in range(0, len(fields), 2):
                name = _text(fields[j])
                if name in _COUNTERS:
                    setattr(c, name, int(fields[j + 1]))
            out.append(c)
        return out

    async def prune(self, before_segment: int) -> list[int]:
        gone = await self._call(
            "prune",
            self.scripts["prune"]([self.keys["segments"]], [self.stem, before_segment]),
        )
        return [int(s) for s in gone]

    async def wait_signal(self, timeout: float) -> None:
        if self._pubsub is None:
            self._pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            await self._call("subscribe", self._pubsub.subscribe(self.keys["signal"]))
        message = await self._call("wait", self._pubsub.get_message(timeout=max(timeout, 0.0)))
        if message is not None:
            # drain the signals that piled up while nobody waited
            while await self._call("wait", self._pubsub.get_message(timeout=0.0)) is not None:
                pass

    async def filter_bytes(self) -> int:
        total = 0
        segments = await self._call("segments", self.redis.zrange(self.keys["segments"], 0, -1))
        for seg in segments:
            meta = self._seg(_text(seg), "bloom")
            layers = int(await self._call("bloom", self.redis.hget(meta, "layers")) or 0)
            for i in range(1, layers + 1):
                usage = await self._call(
                    "memory", self.redis.memory_usage(f"{meta}:{i}", samples=0)
                )
                total += int(usage or 0)
        return total

    async def purge(self) -> None:
        stem = self.keys["ready"].rsplit(":", 1)[0]
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in stem) + ":*"
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            await self._call("purge", self.redis.delete(key))
