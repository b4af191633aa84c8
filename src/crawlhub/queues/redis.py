"""The distributed queue backend: each named queue is a few Redis keys moved by Lua scripts.

Every state change is one script, so it is atomic across any number of hub and worker
processes. Lease deadlines follow :mod:`crawlhub.core.clock`: the caller's clock (epoch
seconds), handed to every script as ``now``; no script reads the server's ``TIME``.

Layout (key names from :func:`crawlhub.core.keys.queue_keys`, one hash slot per queue):

- ``ready``: sorted set, score ``-priority``, member the id zero-padded to 16 digits, so
  equal scores pop in id order (FIFO) by Redis' lexicographic tie-break. Scores are
  small integers and ids never enter a float: ordering is exact for every priority in
  [-2^31, 2^31 - 1] and every id below 2^53.
- ``leased``: sorted set, score the lease deadline in integer milliseconds.
- ``dead``: list of ids in the order they died; ``reasons``: hash id -> why it died.
- ``payloads`` / ``priorities`` / ``attempts``: hashes keyed by id.
- ``stats``: hash of the persistent counters ``total success failed retried``,
  ``failed:<kind>`` (why messages died) and the configured delivery limit ``max_attempts``.
- ``seq``: the id counter; kept by ``purge`` so an id is never reused.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from crawlhub.backends.redis import redis_client
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import QueueError
from crawlhub.core.keys import DEFAULT_PREFIX, queue_keys, queue_registry
from crawlhub.core.redact import redact_url
from crawlhub.queues.common import (
    DEFAULT_MAX_ATTEMPTS,
    BaseQueue,
    QueueCounters,
    Ref,
    Row,
    check_queue_name,
    dead_kind,
    encode_groups,
)

T = TypeVar("T")

_KEY_ORDER = ("ready", "leased", "dead", "payloads", "priorities", "attempts", "stats", "seq",
              "reasons")

# Shared head of every script: key names, the clock, lease checks and the expiry sweep.
# Numbers handed to redis.call become strings with 14 significant digits, which is why
# deadlines are integer milliseconds and scores are plain priorities. Batches travel as
# a few framed string arguments, not one argument per message: packing thousands of
# arguments costs the client more than the script costs the server.
_PRELUDE = """
local ready, leased, dead, payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local priorities, attempts, stats, seq = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local reasons = KEYS[9]
local CHUNK = 1000  -- ids per multi-argument call, well below Lua's unpack() limit
local DEFAULT_MAX_ATTEMPTS = @DEFAULT_MAX_ATTEMPTS@

-- the caller's clock in integer milliseconds (crawlhub.core.clock: no TIME in scripts)
local function now_ms(given)
  return tonumber(given)
end

-- refs arrive as 'member:attempt,member:,...'; an empty attempt means any lease
local function refs(arg)
  return string.gmatch(arg, '(%d+):(%d*)')
end

-- leased now, and by the lease a receipt names when `want` is not ''
local function holds(id, want)
  if not redis.call('ZSCORE', leased, id) then return false end
  return want == '' or redis.call('HGET', attempts, id) == want
end

local function to_ready(id)
  redis.call('ZADD', ready, -tonumber(redis.call('HGET', priorities, id)), id)
end

-- the delivery limit in force; a configured one (given > 0) is stored for every process
local function limit(given)
  local n = tonumber(given)
  if n > 0 then
    redis.call('HSET', stats, 'max_attempts', n)
    return n
  end
  return tonumber(redis.call('HGET', stats, 'max_attempts') or DEFAULT_MAX_ATTEMPTS)
end

local function kill(id, reason, kind)
  redis.call('RPUSH', dead, id)
  redis.call('HSET', reasons, id, reason)
  redis.call('HINCRBY', stats, 'failed:' .. kind, 1)
end

local function spent(a)
  return 'delivered ' .. a .. ' times without ack'
end

-- expired leases back to ready, or to the dead letter once delivered `max` times
local function requeue(now, max)
  local expired = redis.call('ZRANGEBYSCORE', leased, '-inf', now)
  if #expired == 0 then return 0 end
  local back, died = 0, 0
  for _, id in ipairs(expired) do
    local a = tonumber(redis.call('HGET', attempts, id) or '0')
    if a >= max then
      kill(id, spent(a), 'max_attempts'); died = died + 1
    else
      to_ready(id); back = back + 1
    end
  end
  redis.call('ZREMRANGEBYSCORE', leased, '-inf', now)
  if back > 0 then redis.call('HINCRBY', stats, 'retried', back) end
  if died > 0 then redis.call('HINCRBY', stats, 'failed', died) end
  return #expired
end
"""

# push_rows(ready, payloads, priorities, stats, seq, blob, lens, prios): payloads
# concatenated, their byte lengths 'l1,l2,..', their priorities 'p1,p2,..'; returns the
# first id (push_list: the same from Lua lists). Also run by the hub's intake script
# (hub/state/intake/redis.py) when its ledger shares the server, so a task's ledger entry
# and its push are one atomic step.
PUSH_ROWS_LUA = """
-- push_list: the same with the payloads and priorities as Lua lists
local function push_list(ready, payloads, priorities, stats, seq, items, prios)
  local n = #items
  if n == 0 then return 0 end
  local first = redis.call('INCRBY', seq, n) - n + 1
  local z, p, q = {}, {}, {}
  for i = 1, n do
    local id = string.format('%016d', first + i - 1)
    local prio = prios[i]
    z[#z + 1] = prio == '0' and 0 or -tonumber(prio); z[#z + 1] = id
    p[#p + 1] = id; p[#p + 1] = items[i]
    q[#q + 1] = id; q[#q + 1] = prio
    if #q >= 2000 or i == n then
      redis.call('ZADD', ready, unpack(z))
      redis.call('HSET', payloads, unpack(p))
      redis.call('HSET', priorities, unpack(q))
      z, p, q = {}, {}, {}
    end
  end
  redis.call('HINCRBY', stats, 'total', n)
  return first
end

local function push_rows(ready, payloads, priorities, stats, seq, blob, lens_arg, prios_arg)
  local items, prios, pos = {}, {}, 1
  for x in string.gmatch(lens_arg, '%d+') do
    local stop = pos + tonumber(x)
    items[#items + 1] = string.sub(blob, pos, stop - 1)
    pos = stop
  end
  for x in string.gmatch(prios_arg, '[^,]+') do prios[#prios + 1] = x end
  return push_list(ready, payloads, priorities, stats, seq, items, prios)
end
"""

# ARGV: payloads concatenated, their byte lengths 'l1,l2,..', their priorities 'p1,p2,..',
# the configured delivery limit (0: none)
_PUSH = PUSH_ROWS_LUA + """
if tonumber(ARGV[4] or '0') > 0 then limit(ARGV[4]) end
return push_rows(ready, payloads, priorities, stats, seq, ARGV[1], ARGV[2], ARGV[3])
"""

# ARGV: now, visibility timeout ms, n, limit -> {deadline, id, priority, attempts, payload, ...}
_LEASE = """
local now = now_ms(ARGV[1])
local deadline = now + tonumber(ARGV[2])
requeue(now, limit(ARGV[4]))
local popped = redis.call('ZPOPMIN', ready, tonumber(ARGV[3]))
local out = {deadline}
for s = 1, #popped, 2 * CHUNK do
  local ids, z = {}, {}
  for i = s, math.min(s + 2 * CHUNK - 1, #popped), 2 do
    ids[#ids + 1] = popped[i]; z[#z + 1] = deadline; z[#z + 1] = popped[i]
  end
  redis.call('ZADD', leased, unpack(z))
  local pr = redis.call('HMGET', priorities, unpack(ids))
  local pl = redis.call('HMGET', payloads, unpack(ids))
  for j, id in ipairs(ids) do
    out[#out + 1] = id
    out[#out + 1] = pr[j]
    out[#out + 1] = redis.call('HINCRBY', attempts, id, 1)
    out[#out + 1] = pl[j]
  end
end
return out
"""

# ARGV: refs
_ACK = """
local k = 0
for id, want in refs(ARGV[1]) do
  if holds(id, want) then
    redis.call('ZREM', leased, id)
    redis.call('HDEL', payloads, id)
    redis.call('HDEL', priorities, id)
    redis.call('HDEL', attempts, id)
    k = k + 1
  end
end
if k > 0 then redis.call('HINCRBY', stats, 'success', k) end
return k
"""

# ARGV: '1' for the dead letter else '0', refs, reason, limit, kind (of a dead letter)
_NACK = """
local dead_letter = ARGV[1] == '1'
local reason = ARGV[3]
local max = 0
if not dead_letter then max = limit(ARGV[4]) end
local back, died = 0, 0
for id, want in refs(ARGV[2]) do
  if holds(id, want) then
    redis.call('ZREM', leased, id)
    if dead_letter then
      kill(id, reason, ARGV[5]); died = died + 1
    else
      local a = tonumber(redis.call('HGET', attempts, id))
      if a >= max then
        local why = spent(a)
        if reason ~= '' then why = why .. '; last nack: ' .. reason end
        kill(id, why, 'max_attempts'); died = died + 1
      else
        to_ready(id); back = back + 1
      end
    end
  end
end
if back > 0 then redis.call('HINCRBY', stats, 'retried', back) end
if died > 0 then redis.call('HINCRBY', stats, 'failed', died) end
return back + died
"""

# ARGV: now, visibility timeout ms, refs
_EXTEND = """
local deadline = now_ms(ARGV[1]) + tonumber(ARGV[2])
local k = 0
for id, want in refs(ARGV[3]) do
  if holds(id, want) then
    redis.call('ZADD', leased, deadline, id)
    k = k + 1
  end
end
return k
"""

# ARGV: now, limit
_REQUEUE = """
return requeue(now_ms(ARGV[1]), limit(ARGV[2]))
"""

# ARGV: now, limit
_COUNTERS = """
local max = limit(ARGV[2])
requeue(now_ms(ARGV[1]), max)
local c = redis.call('HMGET', stats, 'total', 'success', 'failed', 'retried')
c[5] = redis.call('ZCARD', ready)
c[6] = redis.call('ZCARD', leased)
c[7] = redis.call('LLEN', dead)
c[8] = max
local kinds = redis.call('HMGET', stats, 'failed:max_attempts', 'failed:undeliverable',
                         'failed:nacked')
for i = 1, 3 do c[8 + i] = kinds[i] end
return c
"""

_DEAD_LETTERS = """
local ids = redis.call('LRANGE', dead, 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', priorities, id)
  out[#out + 1] = redis.call('HGET', attempts, id)
  out[#out + 1] = redis.call('HGET', payloads, id)
  out[#out + 1] = redis.call('HGET', reasons, id) or ''
end
return out
"""

_PURGE = """
local k = redis.call('ZCARD', ready) + redis.call('ZCARD', leased) + redis.call('LLEN', dead)
redis.call('DEL', ready, leased, dead, payloads, priorities, attempts, stats, reasons)
return k
"""

_SCRIPTS = {
    "push": _PUSH,
    "lease": _LEASE,
    "ack": _ACK,
    "nack": _NACK,
    "extend": _EXTEND,
    "requeue": _REQUEUE,
    "counters": _COUNTERS,
    "dead_letters": _DEAD_LETTERS,
    "purge": _PURGE,
}


def _member(num: int) -> str:
    return f"{num:016d}"


def _push_args(rows: list[tuple[str, int]], limit: int = 0) -> list[bytes | str]:
    """A push's arguments: every payload in one blob, their lengths, their priorities,
    the queue's configured delivery limit (0: none)."""
    blobs = [data.encode() for data, _ in rows]
    return [
        b"".join(blobs),
        ",".join(str(len(blob)) for blob in blobs),
        ",".join(str(priority) for _, priority in rows),
        str(limit),
    ]


def _ref_arg(refs: list[Ref]) -> str:
    return ",".join(f"{_member(r.num)}:{'' if r.attempt is None else r.attempt}" for r in refs)


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisQueueBackend:
    """Queues on a Redis (or Valkey) server; ``url`` is ``redis://host:port/db``.

    ``prefix`` starts every key, so deployments and tests can share one server.
    ``clock`` (epoch seconds; default the system clock) times every lease, as
    :mod:`crawlhub.core.clock` says; tests pass a fake one.
    """

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.clock: Clock = clock or system_clock
        self.redis = redis_client(url, name="queues")
        prelude = _PRELUDE.replace("@DEFAULT_MAX_ATTEMPTS@", str(DEFAULT_MAX_ATTEMPTS))
        self.scripts = {n: self.redis.register_script(prelude + s) for n, s in _SCRIPTS.items()}
        self._queues: dict[str, RedisQueue] = {}

    def __repr__(self) -> str:
        return f"<RedisQueueBackend {redact_url(self.url)} prefix={self.prefix!r}>"

    def queue(self, name: str, *, max_attempts: int | None = None) -> RedisQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = RedisQueue(check_queue_name(name), self, max_attempts)
        else:
            q.configure(max_attempts)
        return q

    async def push_multi(
        self, groups: Mapping[str, Sequence[tuple[dict[str, Any], int]]]
    ) -> dict[str, list[str]]:
        encoded = encode_groups(groups)
        if not encoded:
            return {}
        queues = [self.queue(name) for name in encoded]
        unregistered = [q.name for q in queues if not q._registered]
        if unregistered:
            await self.call("register queues",
                            self.redis.sadd(queue_registry(self.prefix), *unregistered))
            for q in queues:
                q._registered = True
        script = self.scripts["push"]
        for attempt in (1, 2):
            # Plain EVALSHA in a pipeline: one round trip for every queue (a pipeline
            # holding Script objects would first ask SCRIPT EXISTS).
            async with self.redis.pipeline(transaction=False) as pipe:
                for q, rows in zip(queues, encoded.values(), strict=True):
                    args = _push_args(rows, q.limit)
                    pipe.evalsha(script.sha, len(q._keys), *q._keys, *args)
                try:
                    firsts = await self.call("push to queues", pipe.execute())
                    break
                except QueueError as exc:
                    if attempt == 2 or not isinstance(exc.__cause__, NoScriptError):
                        raise
                    await self.redis.script_load(script.script)
        return {
            name: [str(n) for n in range(int(first), int(first) + len(rows))]
            for (name, rows), first in zip(encoded.items(), firsts, strict=True)
        }

    async def names(self) -> list[str]:
        members = await self.call("names", self.redis.smembers(queue_registry(self.prefix)))
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)

    async def close(self) -> None:
        await self.redis.aclose()

    def now_arg(self) -> str:
        """The clock argument of a script: the caller's now in integer milliseconds."""
        return str(math.floor(self.clock() * 1000))

    async def call(self, op: str, awaitable: Awaitable[T]) -> T:
        """Await a Redis call; Redis errors become a QueueError naming the server and op."""
        try:
            return await awaitable
        except RedisError as exc:
            raise QueueError(
                f"Redis queue at {redact_url(self.url)}: {op} failed: {exc} "
                "(check the server is running and the URL is right)"
            ) from exc


class RedisQueue(BaseQueue):
    """One named queue on a :class:`RedisQueueBackend`."""

    def __init__(self, name: str, backend: RedisQueueBackend,
                 max_attempts: int | None = None) -> None:
        super().__init__(name, max_attempts)
        self.backend = backend
        keys = queue_keys(backend.prefix, name)
        self._keys = [keys[k] for k in _KEY_ORDER]
        self._registered = False

    async def _run(self, script: str, op: str, args: list[Any]) -> Any:
        b = self.backend
        return await b.call(
            f"{op} on queue {self.name!r}", b.scripts[script](keys=self._keys, args=args)
        )

    async def _push(self, rows: list[tuple[str, int]]) -> list[int]:
        b = self.backend
        args = _push_args(rows, self.limit)
        if not self._registered:
            # Once per queue object: a pipeline holding a script costs redis-py an extra
            # SCRIPT EXISTS round trip, so later pushes run the script alone.
            await b.call("register queue", b.redis.sadd(queue_registry(b.prefix), self.name))
            self._registered = True
        first = await self._run("push", "push", args)
        return list(range(int(first), int(first) + len(rows)))

    async def _lease(self, n: int, timeout: float) -> list[Row]:
        args = [self.backend.now_arg(), _ms(timeout), n, self.limit]
        out = await self._run("lease", "lease", args)
        until = int(out[0]) / 1000
        return [
            Row(int(out[i]), out[i + 3], int(out[i + 1]), int(out[i + 2]), until)
            for i in range(1, len(out), 4)
        ]

    async def _ack(self, refs: list[Ref]) -> int:
        return int(await self._run("ack", "ack", [_ref_arg(refs)]))

    async def _nack(self, refs: list[Ref], dead: bool, reason: str | None) -> int:
        args = ["1" if dead else "0", _ref_arg(refs), reason or "", self.limit,
                dead_kind(reason)]
        return int(await self._run("nack", "nack", args))

    async def _extend(self, refs: list[Ref], timeout: float) -> int:
        args = [self.backend.now_arg(), _ms(timeout), _ref_arg(refs)]
        return int(await self._run("extend", "extend", args))

    async def _requeue_expired(self, everything: bool = False) -> int:
        # a deadline is integer ms, so 2**53 (the largest exact Lua number) is past them all
        args = [str(2**53) if everything else self.backend.now_arg(), self.limit]
        return int(await self._run("requeue", "requeue expired leases", args))

    async def _length(self) -> int:
        c = await self._counters()
        return c.ready + c.leased

    async def _counters(self) -> QueueCounters:
        raw = await self._run("counters", "stats", [self.backend.now_arg(), self.limit])
        return QueueCounters(*(int(v or 0) for v in raw))

    async def _dead_letters(self, n: int) -> list[Row]:
        out = await self._run("dead_letters", "dead_letters", [n])
        return [
            Row(int(out[i]), out[i + 3], int(out[i + 1]), int(out[i + 2]), 0.0,
                (out[i + 4].decode() if isinstance(out[i + 4], bytes) else out[i + 4]) or None)
            for i in range(0, len(out), 5)
        ]

    async def _purge(self) -> int:
        b = self.backend
        async with b.redis.pipeline(transaction=False) as pipe:
            await b.scripts["purge"](keys=self._keys, args=[], client=pipe)
            pipe.srem(queue_registry(b.prefix), self.name)
            k, _ = await b.call(f"purge of queue {self.name!r}", pipe.execute())
        self._registered = False
        return int(k)
