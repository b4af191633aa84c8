"""The hub's shared state: the ledger of dispatched tasks, per-outbound counters and
token buckets, on SQLite (one process) or Redis (every hub process sees the same).

The ledger is what makes results and lost-task detection work: a dispatched task is
recorded with a deadline; a result settles it (in one atomic step: the entry closed or
replaced by the next dispatch, the counters moved); a deadline passing leases it to one
sweeping process as lost. What a settle leaves to do (push the next dispatch, log the
failure) stays leased in the ledger until done, so a process killed in between loses
nothing: the next sweep finishes it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from crawlhub import jsoncodec
from crawlhub.hub.intake import Intake, RedisIntake, SqliteIntake
from crawlhub.keys import hub_keys
from crawlhub.storage.redis import redis_client
from crawlhub.storage.sqlite import SqliteDB
from crawlhub.storage.urls import parse_backend_url

#: A ledger entry with no result_timeout is forgotten after this long (seconds).
DEFAULT_RETENTION = 7 * 24 * 3600.0

COUNTER_FIELDS = ("total", "success", "failed", "retried", "rerouted", "failback", "timeout",
                  "orphan")
#: How long a claimed or settled-but-unfinished entry stays leased to one hub process
#: (seconds); a process that dies holding it hands it to the next sweep after this.
CLAIM_LEASE = 30.0
#: Seconds of per-second dispatch counts kept for the outbound rate.
RATE_KEEP = 60


@dataclass(slots=True)
class LedgerEntry:
    """A dispatched task waiting for its result.

    ``deadline`` (epoch seconds) is when it counts as lost (None: never, only retained).
    """

    task: dict[str, Any]
    outbound: str
    deadline: float | None
    #: What is still to be done for this entry while it is under a lease: ``push`` (it is
    #: the next dispatch of its task, not pushed yet), ``fail`` (its task failed; the
    #: failure line is not written yet) or ``timeout`` (its deadline passed). None: the
    #: entry waits for its result.
    pending: str | None = None
    #: For ``pending == "fail"``: ``{"task_result": ..., "reason": ...}`` to log.
    failure: dict[str, Any] | None = None
    #: The stored text this entry was read from; :meth:`HubState.settle` applies only
    #: while the stored entry is still exactly this.
    raw: str | bytes | None = dataclasses.field(default=None, compare=False, repr=False)


class HubState(Protocol):
    """Ledger, counters and token buckets shared by every hub process on one backend."""

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """Store entries, and add ``(outbound, field, n)`` counters in the same write."""
        ...

    # Intake (crawlhub.hub.intake): a new task recorded unpushed, then pushed or undone.
    async def intake_beat(self, owner: str, now: float) -> None:
        """Hub process ``owner`` is alive at ``now``."""
        ...

    async def intake_begin(self, items: Sequence[Intake], now: float, owner: str
                           ) -> list[str]:
        """Record tasks whose uuid is new as unpushed by ``owner``; one flag per task
        (N T A D)."""
        ...

    async def intake_commit(self, items: Sequence[Intake],
                            counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """Mark recorded tasks pushed (deadlines start, gates free) and add counters."""
        ...

    async def intake_abort(self, items: Sequence[Intake], *, release: bool) -> None:
        """Forget recorded tasks that were not pushed; ``release`` keeps their gates
        for the next task of the same URL to take over."""
        ...

    async def intake_claim(self, now: float, dead_before: float, owner: str,
                           limit: int = 500) -> list[Intake]:
        """Claim for ``owner`` the unpushed records of processes silent since
        ``dead_before`` (recovery)."""
        ...

    async def get(self, task_uuid: str) -> LedgerEntry | None: ...

    async def resolve(self, task_uuid: str) -> LedgerEntry | None:
        """Remove and return the entry; None if unknown or already resolved elsewhere."""
        ...

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        """Lease and return entries whose deadline passed (``pending == "timeout"``) and
        entries whose lease ended before they were settled (a process died handling them:
        ``pending`` says what is left to do). A claimed entry stays in the ledger, leased
        until ``now + lease``: one claimer at a time handles it, and settles it."""
        ...

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        """Atomically, if the stored entry of ``current``'s task is still ``current.raw``:
        replace it with ``after`` (None: remove it) and add the ``(outbound, field, n)``
        counters. ``after.pending`` set (``push`` / ``fail``) keeps ``after`` leased until
        ``lease_until``, so that if this process dies before doing it, a sweep does;
        ``after.pending`` None makes it wait for its result (and its deadline).
        Returns False, changing nothing, if the entry changed or went meanwhile."""
        ...

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        """Add ``(outbound, epoch second, n)`` to the dispatch counts every hub process
        reads for the outbound rate (kept for :data:`RATE_KEEP` seconds)."""
        ...

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        """Tasks dispatched per outbound by every hub process in the epoch seconds
        ``first`` to ``last`` (both included)."""
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
    if entry.failure is not None:
        return jsoncodec.dumps({"t": entry.task, "o": entry.outbound, "d": entry.deadline,
                                "f": entry.failure})
    return jsoncodec.dumps({"t": entry.task, "o": entry.outbound, "d": entry.deadline})


def _loads(raw: str | bytes, pending: str | bytes | None = None) -> LedgerEntry:
    data = jsoncodec.loads(raw)
    if isinstance(pending, bytes):
        pending = pending.decode()
    return LedgerEntry(task=data["t"], outbound=data["o"], deadline=data["d"],
                       pending=pending, failure=data.get("f"), raw=raw)


def _text(raw: str | bytes | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


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
CREATE TABLE IF NOT EXISTS leases (
    task_uuid TEXT PRIMARY KEY,
    until REAL NOT NULL,
    pending TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_until ON leases(until);
CREATE TABLE IF NOT EXISTS rates (
    outbound TEXT NOT NULL,
    second INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (outbound, second)
);
"""


class SqliteHubState(SqliteIntake):
    """Hub state in one SQLite file (embedded mode)."""

    def __init__(self, url: str, *, retention: float = DEFAULT_RETENTION,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.retention = retention
        #: Epoch seconds for retention and token buckets; tests pass a fake one.
        self.clock = clock
        self._db = SqliteDB(url, schema=_SCHEMA)
        self._last_purge = 0.0

    async def record(self, entries: Sequence[LedgerEntry],
                     counters: Sequence[tuple[str, str, int]] = ()) -> None:
        now = self.clock()
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

    async def claim_expired(self, now: float, limit: int = 500, *,
                            lease: float = CLAIM_LEASE) -> list[LedgerEntry]:
        purge = now - self._last_purge > 60
        if purge:
            self._last_purge = now
        until = now + lease

        def _claim(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            if purge:
                conn.execute("DELETE FROM ledger WHERE deadline IS NULL AND expires < ?"
                             " AND task_uuid NOT IN (SELECT task_uuid FROM leases)", (now,))
            # Leases that ended unsettled first, so that those just taken are not retaken.
            due = conn.execute(
                "SELECT l.task_uuid, l.pending, g.entry FROM leases AS l LEFT JOIN ledger AS g"
                " ON g.task_uuid = l.task_uuid WHERE l.until <= ? ORDER BY l.until LIMIT ?",
                (now, limit),
            ).fetchall()
            conn.executemany("DELETE FROM leases WHERE task_uuid = ?",
                             [(u,) for u, _, raw in due if raw is None])
            out = [(raw, pending) for _, pending, raw in due if raw is not None]
            lost = conn.execute(
                "SELECT task_uuid, entry FROM ledger WHERE deadline IS NOT NULL"
                " AND deadline <= ? ORDER BY deadline LIMIT ?", (now, limit),
            ).fetchall()
            conn.executemany("UPDATE ledger SET deadline = NULL WHERE task_uuid = ?",
                             [(u,) for u, _ in lost])
            out += [(raw, "timeout") for _, raw in lost]
            conn.executemany(
                "INSERT OR REPLACE INTO leases(task_uuid, until, pending) VALUES (?, ?, ?)",
                [(u, until, pending) for u, pending, raw in due if raw is not None]
                + [(u, until, "timeout") for u, _ in lost])
            return out

        return [_loads(raw, pending) for raw, pending in await self._db.transaction(_claim)]

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        if current.raw is None:
            raise ValueError("settle needs an entry read from the ledger (get/claim_expired)")
        uuid = str(current.task["task_uuid"])
        expected = _text(current.raw)
        raw = None if after is None else _text(after.raw) or _dumps(after)
        expires = self.clock() + self.retention

        def _settle(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT entry FROM ledger WHERE task_uuid = ?",
                               (uuid,)).fetchone()
            if row is None or row[0] != expected:
                return False
            # Settled means pushed: the intake has no push of it left to redo.
            conn.execute("DELETE FROM unpushed WHERE task_uuid = ?", (uuid,))
            if after is None:
                conn.execute("DELETE FROM ledger WHERE task_uuid = ?", (uuid,))
                conn.execute("DELETE FROM leases WHERE task_uuid = ?", (uuid,))
            elif after.pending:
                conn.execute("UPDATE ledger SET entry = ?, deadline = NULL, expires = ?"
                             " WHERE task_uuid = ?", (raw, expires, uuid))
                conn.execute("INSERT OR REPLACE INTO leases(task_uuid, until, pending)"
                             " VALUES (?, ?, ?)", (uuid, lease_until, after.pending))
            else:
                conn.execute("UPDATE ledger SET entry = ?, deadline = ?, expires = ?"
                             " WHERE task_uuid = ?", (raw, after.deadline, expires, uuid))
                conn.execute("DELETE FROM leases WHERE task_uuid = ?", (uuid,))
            _add_counters(conn, counters)
            return True

        if not await self._intake(_settle):
            return False
        if after is not None:
            after.raw = raw
        return True

    async def note_dispatched(self, counts: Sequence[tuple[str, int, int]]) -> None:
        if not counts:
            return
        oldest = max(second for _, second, _ in counts) - RATE_KEEP

        def _note(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO rates(outbound, second, n) VALUES (?, ?, ?)"
                " ON CONFLICT(outbound, second) DO UPDATE SET n = n + excluded.n",
                list(counts))
            conn.execute("DELETE FROM rates WHERE second < ?", (oldest,))

        await self._db.transaction(_note)

    async def dispatched_in(self, first: int, last: int) -> dict[str, int]:
        def _read(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            return conn.execute("SELECT outbound, SUM(n) FROM rates WHERE second BETWEEN"
                                " ? AND ? GROUP BY outbound", (first, last)).fetchall()

        return {outbound: int(n) for outbound, n in await self._db.run(_read)}

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
        now = self.clock()

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

# Token bucket shared by every hub process (KEYS: bucket hash; ARGV: rate, n, burst, and
# a clock reading or ""). Uses the server's clock so hubs on different machines agree.
_TOKENS_LUA = """
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
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

    def __init__(self, url: str, *, prefix: str = "crawlhub:",
                 retention: float = DEFAULT_RETENTION,
                 clock: Callable[[], float] | None = None) -> None:
        self.url = url
        self.retention = retention
        #: Replaces the local clock (retention) and the server's (token buckets); tests
        #: pass a fake one.
        self.clock = clock
        self._redis = redis_client(url, name="hub state")
        self._keys = hub_keys(prefix)
        self._prefix = prefix
        self._record = self._redis.register_script(_RECORD_LUA)
        self._claim = self._redis.register_script(_CLAIM_LUA)
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
            repr((self.clock or time.time)() + self.retention),
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

    async def settle(self, current: LedgerEntry, after: LedgerEntry | None,
                     counters: Sequence[tuple[str, str, int]] = (), *,
                     lease_until: float = 0.0) -> bool:
        if current.raw is None:
            raise ValueError("settle needs an entry read from the ledger (get/claim_expired)")
        raw: str | bytes = "" if after is None else after.raw or _dumps(after)
        args: list[str | bytes | int] = [
            str(current.task["task_uuid"]), current.raw, raw,
            "" if after is None or after.deadline is None else repr(after.deadline),
            "" if after is None else after.pending or "",
            repr(lease_until), repr((self.clock or time.time)() + self.retention),
        ]
        for outbound, name, n in counters:
            args += [f"{outbound}\x1f{name}", n]
        k = self._keys
        done = await self._settle(
            keys=[*self._ledger_keys, k["leases"], k["pending"], k["counters"],
                  k["unpushed"]], args=args)
        if not done:
            return False
        if after is not None:
            after.raw = raw
        return True

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
        now = "" if self.clock is None else repr(self.clock())
        wait = await self._tokens(keys=[f"{self._keys['tokens']}:{scope}"],
                                  args=[rate, n, burst, now])
        return float(wait)

    async def pending(self) -> int:
        return int(await self._redis.hlen(self._keys["ledger"]))

    async def close(self) -> None:
        await self._redis.aclose()
