"""The hub's shared state: the ledger of dispatched tasks, per-outbound counters and
token buckets, on SQLite (one process) or Redis (every hub process sees the same).

The ledger is what makes results and lost-task detection work: a dispatched task is
recorded with a deadline; a result resolves it; a deadline passing claims it as lost.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from crawlhub import jsoncodec
from crawlhub.keys import hub_keys
from crawlhub.sqlitedb import SqliteDB
from crawlhub.storage.redis import redis_client
from crawlhub.storage.urls import parse_backend_url

#: A ledger entry with no result_timeout is forgotten after this long (seconds).
DEFAULT_RETENTION = 7 * 24 * 3600.0

COUNTER_FIELDS = ("total", "success", "failed", "retried", "rerouted", "failback", "timeout")


@dataclass(slots=True)
class LedgerEntry:
    """A dispatched task waiting for its result.

    ``deadline`` (epoch seconds) is when it counts as lost (None: never, only retained).
    """

    task: dict[str, Any]
    outbound: str
    deadline: float | None


class HubState(Protocol):
    """Ledger, counters and token buckets shared by every hub process on one backend."""

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """Store entries, and add ``(outbound, field, n)`` counters in the same write."""
        ...

    async def get(self, task_uuid: str) -> LedgerEntry | None: ...

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        """Remove and return the entry; None if unknown or already resolved elsewhere."""
        ...

    async def claim_expired(self, now: float, limit: int = 500) -> list[LedgerEntry]:
        """Remove and return entries whose deadline passed (lost tasks)."""
        ...

    async def incr(self, outbound: str, field: str, n: int = 1) -> None: ...

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None: ...

    async def counters(self) -> dict[str, dict[str, int]]: ...

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        """Take ``n`` tokens from the bucket of ``scope`` if all are there and return 0;
        otherwise take none and return the seconds until they will be."""
        ...

    async def pending(self) -> int:
        """Entries waiting for a result."""
        ...

    async def close(self) -> None: ...


def open_state(url: str, *, prefix: str = "crawlhub:") -> HubState:
    """The hub state on ``url``: a SQLite file or a Redis/Valkey server."""
    backend = parse_backend_url(url, kinds=("sqlite", "redis"), what="hub state",
                                key="storage.state")
    if backend.kind == "sqlite":
        return SqliteHubState(url)
    return RedisHubState(url, prefix=prefix)


def _dumps(entry: LedgerEntry) -> str:
    return jsoncodec.dumps({"t": entry.task, "o": entry.outbound, "d": entry.deadline})


def _loads(raw: str | bytes) -> LedgerEntry:
    data = jsoncodec.loads(raw)
    return LedgerEntry(task=data["t"], outbound=data["o"], deadline=data["d"])


def _bucket(tokens: float, stamp: float, now: float, rate: float, n: int, burst: float
            ) -> tuple[float, float]:
    """Refill then try to take ``n``: returns (tokens left, seconds to wait or 0)."""
    tokens = min(burst, tokens + max(0.0, now - stamp) * rate)
    if tokens >= n:
        return tokens - n, 0.0
    return tokens, (n - tokens) / rate


def _add_counters(conn: sqlite3.Connection, items: Sequence[tuple[str, str, int]]) -> None:
    if items:
        conn.executemany(
            "INSERT INTO counters(outbound, field, value) VALUES (?, ?, ?)"
            " ON CONFLICT(outbound, field) DO UPDATE SET value = value + excluded.value",
            list(items),
        )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    task_uuid TEXT PRIMARY KEY,
    entry TEXT NOT NULL,
    deadline REAL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_deadline ON ledger(deadline) WHERE deadline IS NOT NULL;
CREATE INDEX IF NOT EXISTS ledger_expires ON ledger(expires);
CREATE TABLE IF NOT EXISTS counters (
    outbound TEXT NOT NULL,
    field TEXT NOT NULL,
    value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (outbound, field)
);
CREATE TABLE IF NOT EXISTS tokens (
    scope TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    stamp REAL NOT NULL
);
"""


class SqliteHubState:
    """Hub state in one SQLite file (embedded mode)."""

    def __init__(self, url: str, *, retention: float = DEFAULT_RETENTION) -> None:
        self.url = url
        self.retention = retention
        self._db = SqliteDB(url, schema=_SCHEMA)
        self._last_purge = 0.0

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        now = time.time()
        rows = [
            (e.task["task_uuid"], _dumps(e), e.deadline, now + self.retention) for e in entries
        ]

        def _write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR REPLACE INTO ledger(task_uuid, entry, deadline, expires)"
                " VALUES (?, ?, ?, ?)",
                rows,
            )
            _add_counters(conn, counters)

        await self._db.transaction(_write)

    async def get(self, task_uuid: str) -> LedgerEntry | None:
        def _get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT entry FROM ledger WHERE task_uuid = ?", (task_uuid,)
            ).fetchone()
            return row[0] if row else None

        raw = await self._db.run(_get)
        return _loads(raw) if raw else None

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        def _pop(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "DELETE FROM ledger WHERE task_uuid = ? RETURNING entry", (task_uuid,)
            ).fetchone()
            return row[0] if row else None

        raw = await self._db.transaction(_pop)
        return _loads(raw) if raw else None

    async def claim_expired(self, now: float, limit: int = 500) -> list[LedgerEntry]:
        purge = now - self._last_purge > 60
        if purge:
            self._last_purge = now

        def _claim(conn: sqlite3.Connection) -> list[str]:
            if purge:
                conn.execute("DELETE FROM ledger WHERE deadline IS NULL AND expires < ?", (now,))
            rows = conn.execute(
                "DELETE FROM ledger WHERE task_uuid IN (SELECT task_uuid FROM ledger"
                " WHERE deadline IS NOT NULL AND deadline <= ? ORDER BY deadline LIMIT ?)"
                " RETURNING entry",
                (now, limit),
            ).fetchall()
            return [r[0] for r in rows]

        return [_loads(raw) for raw in await self._db.transaction(_claim)]

    async def incr(self, outbound: str, field: str, n: int = 1) -> None:
        await self.incr_many([(outbound, field, n)])

    async def incr_many(self, items: Sequence[tuple[str, str, int]]) -> None:
        if not items:
            return

        await self._db.transaction(lambda conn: _add_counters(conn, items))

    async def counters(self) -> dict[str, dict[str, int]]:
        def _read(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
            return conn.execute("SELECT outbound, field, value FROM counters").fetchall()

        result: dict[str, dict[str, int]] = {}
        for outbound, field, value in await self._db.run(_read):
            result.setdefault(outbound, {})[field] = int(value)
        return result

    async def take_tokens(self, scope: str, rate: float, n: int, burst: float) -> float:
        now = time.time()

        def _take(conn: sqlite3.Connection) -> float:
            row = conn.execute("SELECT tokens, stamp FROM tokens WHERE scope = ?",
                               (scope,)).fetchone()
            tokens, stamp = (row[0], row[1]) if row else (burst, now)
            left, wait = _bucket(tokens, stamp, now, rate, n, burst)
            conn.execute(
                "INSERT OR REPLACE INTO tokens(scope, tokens, stamp) VALUES (?, ?, ?)",
                (scope, left, now),
            )
            return wait

        return await self._db.transaction(_take)

    async def pending(self) -> int:
        def _count(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])

        return await self._db.run(_count)

    async def close(self) -> None:
        await self._db.close()


# Atomically move entries whose deadline passed out of the ledger (KEYS: ledger, deadlines,
# retention; ARGV: now, limit). Returns the raw entries.
_CLAIM_LUA = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[1], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  if raw then table.insert(out, raw) end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[3], id)
end
return out
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

# Token bucket shared by every hub process (KEYS: bucket hash; ARGV: rate, n, burst).
# Uses the server's clock so hubs on different machines agree.
_TOKENS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
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


class RedisHubState:
    """Hub state on Redis (distributed mode): every hub process shares it."""

    def __init__(self, url: str, *, prefix: str = "crawlhub:",
                 retention: float = DEFAULT_RETENTION) -> None:
        self.url = url
        self.retention = retention
        self._redis = redis_client(url, name="hub state")
        self._keys = hub_keys(prefix)
        self._prefix = prefix
        self._record = self._redis.register_script(_RECORD_LUA)
        self._claim = self._redis.register_script(_CLAIM_LUA)
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
            repr(time.time() + self.retention),
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

    async def claim_expired(self, now: float, limit: int = 500) -> list[LedgerEntry]:
        raws = await self._claim(keys=self._ledger_keys, args=[now, limit])
        return [_loads(raw) for raw in raws]

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
        wait = await self._tokens(keys=[f"{self._keys['tokens']}:{scope}"],
                                  args=[rate, n, burst])
        return float(wait)

    async def pending(self) -> int:
        return int(await self._redis.hlen(self._keys["ledger"]))

    async def close(self) -> None:
        await self._redis.aclose()
