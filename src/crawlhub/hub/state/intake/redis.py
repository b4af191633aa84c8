"""The intake ledger on the hub's Redis: unpushed records, owners' heartbeats and frontier
gates, one Lua script per step; on a server that also holds the outbound queues the
record and the push are one script (mixed into ``RedisHubState``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from crawlhub.hub.state.intake.base import Intake, QueueGroup

_SPLIT = """
local function split(blob, lengths)
  local out, pos = {}, 1
  for len in string.gmatch(lengths, '[^,]+') do
    local n = tonumber(len)
    out[#out + 1] = string.sub(blob, pos, pos + n - 1)
    pos = pos + n
  end
  return out
end
local function holds(gates, gate, id)
  local v = redis.call('HGET', gates, gate)
  return v == id or v == '+' .. id
end
local function csv(text)
  local out = {}
  for v in string.gmatch(text, '([^,]*),?') do out[#out + 1] = v end
  return out
end
"""

# KEYS: ledger retention unpushed gates owners alive   ARGV: now owner expiry, ids, their
# lengths, entries, their lengths, gates, their lengths. Returns one flag per task.
_BEGIN = _SPLIT + """
local ledger, retention, unpushed, gates, owners = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, owner, expiry = ARGV[1], ARGV[2], ARGV[3]
local ids, entries, gts = split(ARGV[4], ARGV[5]), split(ARGV[6], ARGV[7]), split(ARGV[8], ARGV[9])
redis.call('ZADD', KEYS[6], now, owner)
local out = {}
for i, id in ipairs(ids) do
  local gate, flag = gts[i], 'N'
  if redis.call('HEXISTS', ledger, id) == 1 then
    flag = 'A'
  elseif gate ~= '' then
    local held = redis.call('HGET', gates, gate)
    if held and string.sub(held, 1, 1) == '+' then held = string.sub(held, 2) end
    if held == '' then
      flag = 'T'
    elseif held and redis.call('ZSCORE', unpushed, held) then
      flag = 'D'
    end
  end
  if flag == 'N' or flag == 'T' then
    redis.call('HSET', ledger, id, entries[i])
    redis.call('ZADD', retention, expiry, id)
    redis.call('ZADD', unpushed, now, id)
    redis.call('HSET', owners, id, owner)
    if gate ~= '' then redis.call('HSET', gates, gate, flag == 'T' and '+' .. id or id) end
  end
  out[i] = flag
end
return table.concat(out)
"""

# KEYS: ledger deadlines unpushed gates counters owners   ARGV: ids, lengths, deadlines
# ('' none), gates, lengths, then counter field / increment pairs
_COMMIT = _SPLIT + """
local ledger, deadlines, unpushed, gates = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, dls, gts = split(ARGV[1], ARGV[2]), csv(ARGV[3]), split(ARGV[4], ARGV[5])
for i, id in ipairs(ids) do
  redis.call('HDEL', KEYS[6], id)
  if redis.call('ZREM', unpushed, id) == 1 and dls[i] ~= ''
      and redis.call('HEXISTS', ledger, id) == 1 then
    redis.call('ZADD', deadlines, dls[i], id)
  end
  if gts[i] ~= '' and holds(gates, gts[i], id) then redis.call('HDEL', gates, gts[i]) end
end
for i = 6, #ARGV, 2 do redis.call('HINCRBY', KEYS[5], ARGV[i], ARGV[i + 1]) end
return #ids
"""

# KEYS: ledger retention unpushed gates owners   ARGV: ids, lengths, gates, lengths,
# release '1'/'0'
_ABORT = _SPLIT + """
local ledger, retention, unpushed, gates = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, gts = split(ARGV[1], ARGV[2]), split(ARGV[3], ARGV[4])
for i, id in ipairs(ids) do
  redis.call('HDEL', KEYS[5], id)
  if redis.call('ZREM', unpushed, id) == 1 then
    redis.call('HDEL', ledger, id)
    redis.call('ZREM', retention, id)
  end
  if gts[i] ~= '' and holds(gates, gts[i], id) then
    if ARGV[5] == '1' then redis.call('HSET', gates, gts[i], '') else redis.call('HDEL', gates, gts[i]) end
  end
end
return #ids
"""

# KEYS: ledger unpushed gates owners alive   ARGV: now dead_before owner limit. Claims
# records whose owner has not beaten since dead_before; returns entry, '1' if its gate
# is inherited else '0', for each.
_CLAIM = """
local ledger, unpushed, gates, owners, alive = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, dead_before, owner, limit = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
redis.call('ZADD', alive, now, owner)
redis.call('ZREMRANGEBYSCORE', alive, '-inf', dead_before - 3600)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', unpushed, 0, -1)) do
  if #out >= 2 * limit then break end
  local was = redis.call('HGET', owners, id)
  local beat = was and redis.call('ZSCORE', alive, was)
  if not beat or tonumber(beat) < dead_before then
    local raw = redis.call('HGET', ledger, id)
    if raw then
      redis.call('ZADD', unpushed, now, id)
      redis.call('HSET', owners, id, owner)
      local ok, entry = pcall(cjson.decode, raw)
      local inherited = '0'
      if ok and type(entry) == 'table' and type(entry['g']) == 'string'
          and redis.call('HGET', gates, entry['g']) == '+' .. id then
        inherited = '1'
      end
      out[#out + 1] = raw
      out[#out + 1] = inherited
    else
      redis.call('ZREM', unpushed, id)
      redis.call('HDEL', owners, id)
    end
  end
end
return out
"""


def _push_script() -> str:
    from crawlhub.queues.redis import PUSH_ROWS_LUA

    # KEYS: ledger deadlines retention unpushed gates counters registry owners, then per
    # group (queue, outbound) the queue's ready payloads priorities stats seq.
    # ARGV: mode ('new' | 'commit') now (unused) expiry, ids, lengths, entries,
    # lengths, deadlines, group per task (1-based), payloads, lengths, priorities, gates,
    # lengths, then per group its queue name, outbound name and delivery limit (0: none
    # configured; one > 0 is stored with the queue, as its own push does).
    # 'new': record each task whose uuid is new and push it; 'commit': push each task
    # intake_begin recorded that is still unpushed, and mark it pushed.
    # Returns '1' per task pushed, '0' per task left alone.
    return _SPLIT + PUSH_ROWS_LUA + """
local ledger, deadlines, retention, unpushed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gates, counters, registry, owners = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local mode, expiry = ARGV[1], ARGV[4]
local ids, entries = split(ARGV[5], ARGV[6]), split(ARGV[7], ARGV[8])
local dls, grp = csv(ARGV[9]), csv(ARGV[10])
local payloads, prios, gts = split(ARGV[11], ARGV[12]), csv(ARGV[13]), split(ARGV[14], ARGV[15])
local rows, out, kept, timed, fresh = {}, {}, {}, {}, {}
local function flush()
  if #kept > 0 then redis.call('ZADD', retention, unpack(kept)); kept = {} end
  if #timed > 0 then redis.call('ZADD', deadlines, unpack(timed)); timed = {} end
  if #fresh > 0 then redis.call('HSET', ledger, unpack(fresh)); fresh = {} end
end
-- which uuids the ledger holds, in one call per CHUNK (a uuid twice: the first is new)
local known, seen = {}, {}
if mode == 'new' then
  for s = 1, #ids, 500 do
    local chunk = {}
    for i = s, math.min(s + 499, #ids) do chunk[#chunk + 1] = ids[i] end
    local found = redis.call('HMGET', ledger, unpack(chunk))
    for j, v in ipairs(chunk) do if found[j] then known[v] = true end end
  end
end
for i, id in ipairs(ids) do
  local go = false
  if mode == 'new' then
    go = not known[id] and not seen[id]
    if go then
      seen[id] = true
      fresh[#fresh + 1] = id; fresh[#fresh + 1] = entries[i]
      kept[#kept + 1] = expiry; kept[#kept + 1] = id
    end
  else
    redis.call('HDEL', owners, id)
    go = redis.call('ZREM', unpushed, id) == 1 and redis.call('HEXISTS', ledger, id) == 1
    if gts[i] ~= '' and holds(gates, gts[i], id) then redis.call('HDEL', gates, gts[i]) end
  end
  if go then
    if dls[i] ~= '' then timed[#timed + 1] = dls[i]; timed[#timed + 1] = id end
    if #kept >= 1000 or #timed >= 1000 then flush() end
    local g = tonumber(grp[i])
    local r = rows[g]
    if not r then r = {{}, {}}; rows[g] = r end
    local n = #r[1] + 1
    r[1][n] = payloads[i]; r[2][n] = prios[i]
    out[i] = '1'
  else
    out[i] = '0'
  end
end
flush()
local names = {}
for g, r in pairs(rows) do
  local k, a = 8 + (g - 1) * 5, 16 + (g - 1) * 3
  push_list(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], r[1], r[2])
  if tonumber(ARGV[a + 2]) > 0 then redis.call('HSET', KEYS[k + 4], 'max_attempts', ARGV[a + 2]) end
  names[#names + 1] = ARGV[a]
  redis.call('HINCRBY', counters, ARGV[a + 1] .. '\\31total', #r[1])
end
if #names > 0 then redis.call('SADD', registry, unpack(names)) end
return table.concat(out)
"""


def _packed(parts: Sequence[str]) -> tuple[bytes, str]:
    blobs = [p.encode() for p in parts]
    return b"".join(blobs), ",".join(str(len(b)) for b in blobs) or ""


class RedisIntake:
    """Intake ledger on the hub's Redis (mixed into ``RedisHubState``); on a server that
    also holds the outbound queues, :meth:`intake_push` records and pushes in one script."""

    _redis: Any
    _keys: dict[str, str]
    retention: float
    _intake_scripts: dict[str, Any] | None = None

    def _script(self, name: str) -> Any:
        if self._intake_scripts is None:
            self._intake_scripts = {
                n: self._redis.register_script(text) for n, text in
                (("begin", _BEGIN), ("commit", _COMMIT), ("abort", _ABORT), ("claim", _CLAIM),
                 ("push", _push_script()))}
        return self._intake_scripts[name]

    async def intake_beat(self, owner: str, now: float) -> None:
        await self._redis.zadd(self._keys["alive"], {owner: now})

    async def intake_begin(self, items: Sequence[Intake], now: float, owner: str
                           ) -> list[str]:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        entries, entry_lens = _packed([i.dumps() for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        flags = await self._script("begin")(
            keys=[k["ledger"], k["retention"], k["unpushed"], k["gates"], k["owners"],
                  k["alive"]],
            args=[repr(now), owner, repr(now + self.retention), ids, id_lens, entries,
                  entry_lens, gates, gate_lens])
        text = flags.decode() if isinstance(flags, bytes) else str(flags)
        return list(text)

    async def intake_free(self, items: Sequence[Intake]) -> list[bool]:
        """One round trip: True where the item's uuid is not in the ledger and its gate
        has no field (nobody holds it, nobody released it untaken)."""
        if not items:
            return []
        k = self._keys
        gated = [i.gate for i in items if i.gate]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k["ledger"], [i.uuid for i in items])
            if gated:
                pipe.hmget(k["gates"], gated)
            replies = await pipe.execute()
        held = iter(replies[1] if gated else ())
        out = []
        for item, entry in zip(items, replies[0], strict=True):
            gate_free = next(held) is None if item.gate else True
            out.append(entry is None and gate_free)
        return out

    async def intake_commit(self, items: Sequence[Intake],
                            counters: Sequence[tuple[str, str, int]] = ()) -> None:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        deadlines = ",".join("" if i.deadline is None else repr(i.deadline) for i in items)
        args: list[Any] = [ids, id_lens, deadlines, gates, gate_lens]
        for outbound, field, n in counters:
            args += [f"{outbound}\x1f{field}", n]
        await self._script("commit")(
            keys=[k["ledger"], k["deadlines"], k["unpushed"], k["gates"], k["counters"],
                  k["owners"]],
            args=args)

    async def intake_abort(self, items: Sequence[Intake], *, release: bool) -> None:
        k = self._keys
        ids, id_lens = _packed([i.uuid for i in items])
        gates, gate_lens = _packed([i.gate or "" for i in items])
        await self._script("abort")(
            keys=[k["ledger"], k["retention"], k["unpushed"], k["gates"], k["owners"]],
            args=[ids, id_lens, gates, gate_lens, "1" if release else "0"])

    async def intake_claim(self, now: float, dead_before: float, owner: str,
                           limit: int = 500) -> list[Intake]:
        k = self._keys
        raws = await self._script("claim")(
            keys=[k["ledger"], k["unpushed"], k["gates"], k["owners"], k["alive"]],
            args=[repr(now), repr(dead_before), owner, limit])
        out = []
        for i in range(0, len(raws), 2):
            intake = Intake.loads(raws[i])
            intake.inherited = raws[i + 1] in (b"1", "1")
            out.append(intake)
        return out

    def _push_call(self, mode: str, items: Sequence[tuple[Intake, int, str, int]],
                   groups: Sequence[QueueGroup], registry: str, now: float
                   ) -> tuple[list[str], list[Any]]:
        k = self._keys
        keys = [k["ledger"], k["deadlines"], k["retention"], k["unpushed"], k["gates"],
                k["counters"], registry, k["owners"]]
        names: list[str] = []
        for g in groups:
            keys += g.keys
            names += [g.queue, g.outbound, str(g.limit)]
        intakes = [i for i, _, _, _ in items]
        ids, id_lens = _packed([i.uuid for i in intakes])
        entries, entry_lens = (_packed([i.raw or i.dumps() for i in intakes]) if mode == "new"
                               else (b"", ",".join("0" for _ in intakes)))
        payloads, payload_lens = _packed([p for _, _, p, _ in items])
        gates, gate_lens = _packed([i.gate or "" for i in intakes])
        args: list[Any] = [
            mode, repr(now), "0", repr(now + self.retention), ids, id_lens,
            entries, entry_lens,
            ",".join("" if i.deadline is None else repr(i.deadline) for i in intakes),
            ",".join(str(g + 1) for _, g, _, _ in items),
            payloads, payload_lens, ",".join(str(p) for _, _, _, p in items),
            gates, gate_lens, *names]
        return keys, args

    async def intake_push(self, mode: str, items: Sequence[tuple[Intake, int, str, int]],
                          groups: Sequence[QueueGroup], registry: str, now: float
                          ) -> list[bool]:
        """One script: ``mode='new'`` records each item whose uuid is new and pushes it;
        ``mode='commit'`` pushes each item :meth:`intake_begin` recorded that is still
        unpushed and marks it pushed. ``items``: (intake, group index, payload JSON,
        priority). Returns per item whether it was pushed."""
        return await (await self.intake_push_sent(mode, items, groups, registry, now))

    async def intake_push_sent(self, mode: str, items: Sequence[tuple[Intake, int, str, int]],
                               groups: Sequence[QueueGroup], registry: str, now: float
                               ) -> asyncio.Future[list[bool]]:
        """:meth:`intake_push`, returning once the script is on its way to Redis: the
        future gives its answer, so the caller can prepare the next batch meanwhile."""
        keys, args = self._push_call(mode, items, groups, registry, now)
        script = self._script("push")
        pool = self._redis.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            await pool.release(conn)
            raise
        return asyncio.ensure_future(self._push_reply(conn, script, keys, args))

    async def _push_reply(self, conn: Any, script: Any, keys: list[str], args: list[Any]
                          ) -> list[bool]:
        from redis.exceptions import NoScriptError

        pool = self._redis.connection_pool
        try:
            try:
                flags = await conn.read_response()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                raise
            finally:
                await pool.release(conn)
        except NoScriptError:  # a server that has not seen it yet (it did nothing): load, run
            flags = await script(keys=keys, args=args)
        text = flags.decode() if isinstance(flags, bytes) else str(flags)
        return [c == "1" for c in text]
