"""The distributed seed store: seeds, leases and a shared bloom filter in Redis, moved by
Lua scripts so any number of processes see one frontier.

The bloom filter is plain Redis strings written with ``BITFIELD`` (no RedisBloom module,
whose licence is not open source). Clients hash each key once (xxh3-128) and send two
32-bit halves in one packed argument per batch; the admit script derives the k bit
positions of every layer by double hashing and tests all layers (``GETBIT``, stopping
at the first clear bit). A filter hit is a duplicate; a miss is settled by ``HSETNX``
of the seed record, so two processes never both admit one key, and the admitted seed
is queued and counted in the same atomic step. Setting a new key's k bits costs Redis
more than the rest of its admission, so a second script (set_bits) does it, written
to Redis as soon as admit has its answer: Redis sets the bits while the caller works
on its next batch. Until then (or for good, if the process dies in between) a repeat
of the key misses the filter and HSETNX finds it stored.

Each process also caches the keys the shared filter has answered for (``CACHE_SHARE``):
a repeat it has seen costs no round trip.

Layout (names from :func:`crawlhub.core.keys.frontier_keys`, all in the frontier's slot):

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

import asyncio
import contextlib
import logging
import math
import struct
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from crawlhub.backends.redis import redis_client
from crawlhub.core.errors import FrontierError
from crawlhub.core.keys import frontier_keys, frontier_segment_key
from crawlhub.core.redact import redact_url
from crawlhub.frontier.bloom import MAX_LAYER_BITS, FixedBloom, layer_plan, split_hash
from crawlhub.frontier.seed import Outcome, Seed
from crawlhub.frontier.sqlite import check_frontier_name
from crawlhub.frontier.store import Entry, SegmentCounts, check_entries, task_uuid_of

T = TypeVar("T")
log = logging.getLogger("crawlhub.frontier")

_BATCH = 1000
#: Share of the ``fp_rate`` budget given to each process's cache of keys the shared
#: filter has answered for (admitted or found). A key in the cache is present in the
#: shared filter too (its bits are never cleared), unless the cache is wrong (a false
#: positive of its own): so the shared filter is planned at the rest of the budget and
#: the two together stay under ``fp_rate``. About 3 bytes per cached key.
CACHE_SHARE = 0.01
#: Keys cached per segment at most; beyond, keys go to Redis as they come.
CACHE_MAX = 4_000_000
#: set_bits scripts in flight at most before admit waits for Redis to catch up.
_SETTERS_MAX = 4
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

# The bloom filter of one segment, for the admit and set_bits scripts.
# KEYS[1]: the filter's meta hash   ARGV[1]: segment   ARGV[2]: plan, 'capacity,bits,k;...'
# for each layer the filter may grow to.
_FILTER = """
local meta, seg = KEYS[1], ARGV[1]
local plan = {}
for cap, bits, k in string.gmatch(ARGV[2], '(%d+),(%d+),(%d+)') do
  plan[#plan + 1] = {tonumber(cap), tonumber(bits), tonumber(k)}
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
  redis.call('SETRANGE', meta .. ':' .. i, spec[2] / 8 - 1, '\\0')
  layers[i] = {cap = spec[1], bits = spec[2], k = spec[3], count = 0, key = meta .. ':' .. i}
  redis.call('HSET', meta, 'layers', i, 'cap' .. i, spec[1], 'bits' .. i, spec[2],
             'k' .. i, spec[3], 'count' .. i, 0)
end
if #layers == 0 then add_layer() end

-- bit j of a key in a layer: (h1 + j * h2) mod bits (double hashing). Offsets go to
-- Redis as '%d' strings: a number argument costs a '%.17g' conversion per call.
local fmt = string.format

local function present(h1, h2)
  for i = 1, #layers do
    local layer = layers[i]
    local all = true
    for j = 0, layer.k - 1 do
      -- GETBIT stops at the first clear bit: a new key rarely needs more than two
      if redis.call('GETBIT', layer.key, fmt('%d', (h1 + j * h2) % layer.bits)) == 0 then
        all = false
        break
      end
    end
    if all then return true end
  end
  return false
end
"""

# KEYS: meta seeds stats ready due seq segments
# ARGV: segment plan now_ms exact channel entries duplicates
#   entries: for each seed the header _ENTRY (h1 h2 ready_ms dispatched, then the
#   lengths of the priority's text, the key and the payload), then those three
#   duplicates: repeats of a key inside the batch, already settled by the client
# Returns one character per entry: '1' admitted, '0' a duplicate; '2' a duplicate the
# filter missed (stored, its bits not set yet); '3' admitted though the filter had it
# (exact: a false positive). The bits of '1' and '2' are set_bits' job.
_ADMIT = """
local seeds, stats, ready, due = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seqkey, segments = KEYS[6], KEYS[7]
local now, exact, channel, blob = tonumber(ARGV[3]), ARGV[4] == '1', ARGV[5], ARGV[6]

-- new seeds are written in multi-member calls, CHUNK at a time
local CHUNK = 1000
local ready_set, due_set = {}, {}
local function flush()
  if #ready_set > 0 then redis.call('ZADD', ready, unpack(ready_set)); ready_set = {} end
  if #due_set > 0 then redis.call('ZADD', due, unpack(due_set)); due_set = {} end
end

local out = {}
local admitted, dups, pending, dispatched, signal = 0, tonumber(ARGV[7]), 0, 0, false
local seq = tonumber(redis.call('GET', seqkey) or '0')
local pos, e = 1, 0
while pos <= #blob do
  e = e + 1
  local h1, h2, ready_ms, disp, plen, klen, vlen, at =
    struct.unpack('<I4I4dBBI4I4', blob, pos)
  local kat = at + plen
  local key = string.sub(blob, kat, kat + klen - 1)
  pos = kat + klen + vlen
  local hit = present(h1, h2)
  if hit and not exact then
    dups = dups + 1
    out[e] = '0'
  else
    -- strings built by concatenation: a number turned into text costs a sprintf
    local sq, prio = fmt('%016d', seq + 1), string.sub(blob, at, kat - 1)
    local record = sq .. '|' .. prio .. '|' .. string.sub(blob, kat + klen, pos - 1)
    -- the seed record decides: HSETNX admits a key exactly once
    if redis.call('HSETNX', seeds, key, record) == 0 then
      dups = dups + 1
      out[e] = hit and '0' or '2'
    else
      seq = seq + 1
      if disp == 1 then
        dispatched = dispatched + 1
      else
        local member = sq .. '|' .. prio .. '|' .. seg .. '|' .. key
        if ready_ms <= now then
          ready_set[#ready_set + 1] = prio == '0' and '0' or -tonumber(prio)
          ready_set[#ready_set + 1] = member
          signal = true
        else
          due_set[#due_set + 1] = ready_ms
          due_set[#due_set + 1] = member
        end
        pending = pending + 1
      end
      admitted = admitted + 1
      out[e] = hit and '3' or '1'
      if #ready_set + #due_set >= 2 * CHUNK then flush() end
    end
  end
end
flush()
if admitted > 0 then redis.call('SET', seqkey, string.format('%d', seq)) end
redis.call('HINCRBY', stats, 'admitted', admitted)
if dups > 0 then redis.call('HINCRBY', stats, 'duplicates', dups) end
if pending > 0 then redis.call('HINCRBY', stats, 'pending', pending) end
if dispatched > 0 then redis.call('HINCRBY', stats, 'dispatched', dispatched) end
redis.call('ZADD', segments, tonumber(seg), seg)
if signal then redis.call('PUBLISH', channel, '1') end
return table.concat(out)
"""

# KEYS: meta   ARGV: segment plan admitted found
#   admitted, found: h1 h2 ('<I4I4') of each key admit stored ('1') or found stored
#   unknown to the filter ('2'); bits of the latter may be set already (then skipped)
_SET_BITS = """
local set_args = {}
local function add(h1, h2)
  local layer = layers[#layers]
  if layer.count >= layer.cap then
    add_layer()
    layer = layers[#layers]
  end
  local args = set_args[#layers]
  if not args then
    args = {}
    for j = 0, layer.k - 1 do
      args[4 * j + 1] = 'SET'; args[4 * j + 2] = 'u1'; args[4 * j + 4] = '1'
    end
    set_args[#layers] = args
  end
  for j = 0, layer.k - 1 do args[4 * j + 3] = fmt('%d', (h1 + j * h2) % layer.bits) end
  redis.call('BITFIELD', layer.key, unpack(args))
  layer.count = layer.count + 1
end
for pos = 1, #ARGV[3], 8 do
  add(struct.unpack('<I4I4', ARGV[3], pos))
end
for pos = 1, #ARGV[4], 8 do
  local h1, h2 = struct.unpack('<I4I4', ARGV[4], pos)
  if not present(h1, h2) then add(h1, h2) end
end
local counts = {}
for i = 1, #layers do
  counts[#counts + 1] = 'count' .. i
  counts[#counts + 1] = layers[i].count
end
redis.call('HSET', meta, unpack(counts))
return #layers
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

# KEYS: ready due leased   ARGV: stem channel seg key outcome now_ms ready_ms archive
#   archive '0': a seed finished ok or failed loses its record and attempts (the filter
#   alone remembers its key)
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
if outcome == 'ok' or outcome == 'failed' then
  count(stem, seg, outcome == 'ok' and 'done' or 'failed', 1)
  if ARGV[8] == '0' then
    redis.call('HDEL', stem .. seg .. ':seeds', key)
    redis.call('HDEL', stem .. seg .. ':attempts', key)
  end
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
    "admit": _FILTER + _ADMIT,
    "set_bits": _FILTER + _SET_BITS,
    "claim": _CLAIM,
    "extend": _EXTEND,
    "release": _RELEASE,
    "finish": _FINISH,
    "counts": _COUNTS,
    "prune": _PRUNE,
}


#: A seed's header in the admit script's packed argument (Lua: struct.unpack).
_ENTRY = struct.Struct("<IIdBBII")


def _pack(entries: Sequence[Entry], indexes: Sequence[int]) -> tuple[bytes, list[bytes]]:
    """The admit script's entries argument (one blob instead of seven arguments per seed,
    which would cost the client more to encode than the script costs Redis), and each
    seed's hash halves as set_bits takes them."""
    parts: list[bytes] = []
    pairs: list[bytes] = []
    header = _ENTRY.pack
    for i in indexes:
        e = entries[i]
        h1, h2 = split_hash(e.hash)
        priority = str(e.seed.priority).encode()
        key = e.key.encode()
        payload = e.seed.encode().encode()
        head = header(h1, h2, _ms(e.ready_at), e.dispatched, len(priority), len(key), len(payload))
        parts += (head, priority, key, payload)
        pairs.append(head[:8])  # h1 h2, as _PAIR packs them
    return b"".join(parts), pairs


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSeedStore:
    """Seeds of frontier ``name`` on the Redis (or Valkey) server at ``url``."""

    def __init__(
        self, url: str, name: str, *, prefix: str, expected_items: int, fp_rate: float,
        archive: bool = True,
    ) -> None:
        self.name = check_frontier_name(name)
        self.url = url
        self.prefix = prefix
        #: False: finished seeds lose their records (see FrontierConfig.archive)
        self.archive = archive
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self.keys = frontier_keys(prefix, name)
        self.stem = self.keys["segment"]
        plan = layer_plan(expected_items, fp_rate * (1 - CACHE_SHARE), 24)
        self._plan = [layer for layer in plan if layer.bits <= MAX_LAYER_BITS]
        if not self._plan:
            raise FrontierError(
                f"frontier {name!r}: expected_items {expected_items} at fp_rate {fp_rate} "
                "needs a bloom layer over 2^32 bits, the most a Redis string holds: lower "
                "expected_items or raise fp_rate"
            )
        self._plan_arg = ";".join(
            f"{layer.capacity},{layer.bits},{layer.hashes}" for layer in self._plan
        )
        self.redis = redis_client(url, name=f"frontier {name!r}")
        self.scripts = {n: self.redis.register_script(_PRELUDE + s) for n, s in _SCRIPTS.items()}
        self._pubsub: Any = None
        # per segment, keys the shared filter answered for in this process: a repeat
        # found here is a duplicate without a round trip (see CACHE_SHARE)
        self._answered: dict[int, FixedBloom] = {}
        # tasks setting the filter bits of admitted keys (see _owe)
        self._setters: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<RedisSeedStore {self.name!r} at {redact_url(self.url)} prefix={self.prefix!r}>"

    async def _call(self, op: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except RedisError as exc:
            raise FrontierError(
                f"frontier {self.name!r} on Redis {redact_url(self.url)}: {op} failed: {exc} "
                "(check the server is running and the URL is right)"
            ) from exc

    def _seg(self, segment: int | str, part: str) -> str:
        return frontier_segment_key(self.prefix, self.name, int(segment), part)

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self._call("ping", self.redis.ping())

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.settle()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
        await self.redis.aclose()

    async def snapshot(self, current_segment: int) -> None:
        """The filter lives in Redis (persisted by Redis itself); this frees the caches
        of past segments."""
        for segment in [s for s in self._answered if s < current_segment]:
            del self._answered[segment]

    # ------------------------------------------------------------------ admission
    async def admit(self, entries: Sequence[Entry], now: float, *, exact: bool) -> list[bool]:
        check_entries(entries)
        results = [False] * len(entries)
        # per segment: key -> index of its first entry; repeats in the batch and keys this
        # process saw answered before are duplicates settled here
        groups: dict[int, dict[str, int]] = defaultdict(dict)
        settled: dict[int, int] = defaultdict(int)
        for i, e in enumerate(entries):
            first = groups[e.segment]
            if e.key in first or (not exact and e.hash in self._cache(e.segment)):
                settled[e.segment] += 1
            else:
                first[e.key] = i
        owing = False
        for segment, first in groups.items():
            owing |= await self._admit_segment(
                entries, list(first.values()), segment, settled[segment], now, exact, results
            )
        while owing and len(self._setters) > _SETTERS_MAX:  # Redis is behind: wait for it
            await asyncio.wait(set(self._setters), return_when=asyncio.FIRST_COMPLETED)
        return results

    async def duplicates(self, entries: Sequence[Entry], *, exact: bool) -> list[bool]:
        """One HMGET of the seed records per segment (exact or not: a stored key is
        certainly a duplicate) and one HINCRBY of the segment's duplicate count."""
        check_entries(entries)
        out = [False] * len(entries)
        by_segment: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(entries):
            by_segment[e.segment].append(i)
        for segment, indexes in by_segment.items():
            found = await self._call("duplicates", self.redis.hmget(
                self._seg(segment, "seeds"), [entries[i].key for i in indexes]))
            n = 0
            for i, record in zip(indexes, found, strict=True):
                if record is not None:
                    out[i] = True
                    n += 1
            if n:
                await self._call("duplicates", self.redis.hincrby(
                    self._seg(segment, "stats"), "duplicates", n))
        return out

    async def _admit_segment(
        self,
        entries: Sequence[Entry],
        indexes: list[int],
        segment: int,
        settled: int,
        now: float,
        exact: bool,
        results: list[bool],
    ) -> bool:
        """The admit script over ``entries[indexes]`` of one segment; True when filter
        bits are owed."""
        k = self.keys
        keys = [
            self._seg(segment, "bloom"),
            self._seg(segment, "seeds"),
            self._seg(segment, "stats"),
            k["ready"],
            k["due"],
            k["seq"],
            k["segments"],
        ]
        if not indexes:  # all settled here: only the counter goes to Redis
            await self._call("admit", self.redis.hincrby(keys[2], "duplicates", settled))
            return False
        cache = self._cache(segment)
        owing = False
        for start in range(0, len(indexes), _BATCH):
            chunk = indexes[start : start + _BATCH]
            blob, pairs = _pack(entries, chunk)
            args: list[str | int | bytes] = [
                segment,
                self._plan_arg,
                _ms(now),
                "1" if exact else "0",
                k["signal"],
                blob,
                settled if start == 0 else 0,
            ]
            flags = _text(await self._call("admit", self.scripts["admit"](keys, args)))
            owed: dict[str, list[bytes]] = {"1": [], "2": []}
            for i, pair, flag in zip(chunk, pairs, flags, strict=True):
                results[i] = flag in "13"
                if flag in owed:
                    owed[flag].append(pair)
                cache.add(entries[i].hash)  # admitted or found: the shared filter has it
            if owed["1"] or owed["2"]:
                await self._owe(segment, b"".join(owed["1"]), b"".join(owed["2"]))
                owing = True
        return owing

    async def _owe(self, segment: int, admitted: bytes, found: bytes) -> None:
        """Have the bits of stored keys set after ``admit`` returns (the seed records
        decide admission; the filter may learn a key a moment later). The script is
        written to Redis now, so Redis sets the bits while the caller works on its next
        batch; a task reads the reply."""
        args = [segment, self._plan_arg, admitted, found]
        key = self._seg(segment, "bloom")
        pool = self.redis.connection_pool
        try:
            conn = await pool.get_connection()
        except Exception:
            log.exception("frontier %s: setting filter bits failed", self.name)
            return
        try:
            await conn.send_command("EVALSHA", self.scripts["set_bits"].sha, 1, key, *args)
        except Exception:
            await pool.release(conn)
            log.exception("frontier %s: setting filter bits failed", self.name)
            return
        task = asyncio.create_task(self._set_bits_reply(conn, key, args))
        self._setters.add(task)
        task.add_done_callback(self._setters.discard)

    async def _set_bits_reply(self, conn: Any, key: str, args: list[Any]) -> None:
        pool = self.redis.connection_pool
        try:
            try:
                await conn.read_response()
            finally:
                await pool.release(conn)
        except NoScriptError:  # a server that has not seen the script yet: load and run it
            try:
                await self.scripts["set_bits"]([key], args)
            except Exception:
                log.exception("frontier %s: setting filter bits failed", self.name)
        except Exception:  # the keys stay admitted once; their repeats cost an HSETNX
            log.exception("frontier %s: setting filter bits failed", self.name)

    async def settle(self) -> None:
        """Wait until the filter has the bits of every key admitted so far."""
        while self._setters:
            await asyncio.wait(set(self._setters))

    def _cache(self, segment: int) -> FixedBloom:
        cache = self._answered.get(segment)
        if cache is None:
            capacity = min(self.expected_items, CACHE_MAX)
            cache = self._answered[segment] = FixedBloom(capacity, self.fp_rate * CACHE_SHARE)
        return cache

    async def admitted_by(self, segment: int, key: str) -> str | None:
        raw = await self._call("admitted_by", self.redis.hget(self._seg(segment, "seeds"), key))
        if raw is None:
            return None
        return task_uuid_of(_text(raw).split("|", 2)[2])

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
                [self.stem, k["signal"], segment, key, outcome, _ms(now), _ms(ready_at),
                 "1" if self.archive else "0"],
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
        for segment in gone:
            self._answered.pop(int(segment), None)
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
        self._answered.clear()
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            await self._call("purge", self.redis.delete(key))
